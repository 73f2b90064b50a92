// hybridcomm device protocol: the one header every kernel shares.
//
// Data moves as LL packets: 16 bytes carrying 8 bytes of payload and the call's flag twice,
// written by one 16-byte store straight into the receiver's buffer (push). The receiver
// polls its own memory until both flags equal the call's flag: data and "ready" arrive
// together, so small messages need no separate barrier. A torn store (8-byte atomicity)
// shows a stale flag in one half and is simply polled again.
//
// Flags are a per-group call counter kept in device memory (GroupState::calls): every call
// reads it, uses calls + 1 as its flag, and the last block to finish stores calls + 1. So a
// CUDA graph replays with fresh flags and never needs host fix-ups. Receive areas rotate
// over two slots (flag parity); an arrival flag per peer makes sure a fast rank never
// writes a slot its peer may still read (see arrive / wait_arrivals).
//
// Every wait has a deadline. On expiry the waiting thread records (code, op, group, peer)
// in an error word mirrored to pinned host memory and raises the group's abort flag; every other wait then
// gives up at once, the kernel finishes, and the host raises PeerTimeout on its next call.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace hc {

constexpr int kMaxRanks = 8;
constexpr int kThreads = 512;
constexpr int kMaxBlocks = 256;
constexpr int kArrivalBytes = 256;
// Flags at the start of a group's region: arrival flags, then one flag per (phase, source,
// block) for the bulk protocol.
constexpr int kFlagBytes = kArrivalBytes + 2 * kMaxRanks * kMaxBlocks * 4;

enum ErrorCode : uint32_t { kOk = 0, kTimeout = 1, kCapacity = 2 };
enum Op : int { kAllReduce = 1, kAllGatherV = 2, kReduceScatterV = 3, kGatherTokens = 4, kScatterTokens = 5 };
enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// -- what the host passes ------------------------------------------------------------------

// One group's view of the workspace, fixed for the communicator's lifetime.
struct GroupArgs {
  int nranks;                      // members of the group
  int me;                          // my index in the group
  int world_ranks[kMaxRanks];      // global rank of each member (for error reports)
  char* regions[kMaxRanks];        // each member's region of the symmetric buffer (peer pointers)
  uint32_t* state;                 // local GroupState
  unsigned long long* error_word;    // device memory, shared by all groups of the communicator
  unsigned long long* error_mirror;  // pinned host memory the host polls without a sync
  uint64_t area_bytes;             // bytes of one receive area (one source, one slot, A or B)
  uint64_t timeout_ns;
  int group_id;                    // index of the group's name, for error reports
  int max_blocks;                  // grid limit (host side): one block per SM keeps all co-resident
};

// Row counts per member: read from device memory (graph replays with new counts) or given inline.
struct SizesArg {
  const int32_t* device;  // null: use host[]
  int32_t host[kMaxRanks];
};

// GroupState words (local device memory, zero at start).
enum : int { kCalls = 0, kBlocksDone = 1, kAborted = 2 };

__device__ __forceinline__ int64_t grid_thread() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return (int64_t)gridDim.x * blockDim.x; }

// -- errors and deadlines ------------------------------------------------------------------

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void record_error(const GroupArgs& g, uint32_t code, int op, int member) {
  unsigned long long word = (unsigned long long)code | ((unsigned long long)(op & 0xff) << 8) |
                            ((unsigned long long)(g.group_id & 0xff) << 16) |
                            ((unsigned long long)(g.world_ranks[member] & 0xffff) << 24);
  // First error wins. The CAS is on device memory (atomics on host memory need PCIe atomics);
  // the winner copies the word to the host-visible mirror with a plain store.
  if (atomicCAS(g.error_word, 0ull, word) == 0ull) {
    *(volatile unsigned long long*)g.error_mirror = word;
    __threadfence_system();
  }
  if (code == kTimeout) atomicExch(&g.state[kAborted], 1u);
}

struct Deadline {
  uint64_t end;
  __device__ __forceinline__ explicit Deadline(const GroupArgs& g) : end(global_timer_ns() + g.timeout_ns) {}

  // True when this wait should stop: the group already aborted, or time ran out (recorded
  // against `member`, the peer being waited for).
  __device__ __forceinline__ bool give_up(const GroupArgs& g, int op, int member) const {
    if (*(volatile uint32_t*)&g.state[kAborted]) return true;
    if (global_timer_ns() < end) return false;
    record_error(g, kTimeout, op, member);
    return true;
  }
};

// -- call bookkeeping ------------------------------------------------------------------------

struct Call {
  uint32_t flag;  // this call's flag: completed calls + 1
  int slot;       // which of the two rotating slots this call uses
};

__device__ __forceinline__ Call begin_call(const GroupArgs& g) {
  uint32_t done = *(volatile uint32_t*)&g.state[kCalls];
  return Call{done + 1, (int)((done + 1) & 1)};
}

// Region layout: [flags][slot 0: area A x n, area B x n][slot 1: same].
__device__ __forceinline__ uint32_t* arrival_flags(char* region) { return (uint32_t*)region; }

// The area where `src` puts its packets for the owner of `region` (A: phase 1, B: phase 2).
__device__ __forceinline__ uint4* area(const GroupArgs& g, char* region, int slot, int phase, int src) {
  uint64_t index = ((uint64_t)slot * 2 + phase) * g.nranks + src;
  return (uint4*)(region + kFlagBytes + index * g.area_bytes);
}

// Block 0 tells every peer "I have started call `flag`", hence finished reading call flag - 1.
__device__ __forceinline__ void arrive(const GroupArgs& g, const Call& c) {
  if (blockIdx.x == 0 && threadIdx.x < g.nranks && threadIdx.x != g.me) {
    volatile uint32_t* dst = arrival_flags(g.regions[threadIdx.x]) + g.me;
    *dst = c.flag;
  }
}

// Block 0 waits until every peer has started this call. A peer that is one call ahead has
// already overwritten the flag with flag + 1, hence the signed comparison.
__device__ __forceinline__ void wait_arrivals(const GroupArgs& g, const Call& c, const Deadline& dl, int op) {
  if (blockIdx.x == 0 && threadIdx.x < g.nranks && threadIdx.x != g.me) {
    volatile uint32_t* src = arrival_flags(g.regions[g.me]) + threadIdx.x;
    int spins = 0;
    while ((int32_t)(*src - c.flag) < 0) {
      if ((++spins & 63) == 0 && dl.give_up(g, op, threadIdx.x)) break;
    }
  }
}

// Every block ends here; the last one publishes the call as completed.
__device__ __forceinline__ void end_call(const GroupArgs& g, const Call& c, const Deadline& dl, int op) {
  wait_arrivals(g, c, dl, op);
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t before = atomicAdd(&g.state[kBlocksDone], 1u);
    if (before == gridDim.x - 1) {
      g.state[kBlocksDone] = 0;
      *(volatile uint32_t*)&g.state[kCalls] = c.flag;
    }
  }
}

// -- bulk protocol: plain stores, then one release flag per block ------------------------------
//
// For large messages, where LL's 2x bytes cost more than a flag round trip. A block writes
// its share to a peer with ordinary 16-byte stores, then (after a barrier) one thread per
// peer fences and stores the call's flag into that peer's flag for (phase, me, block). The
// peer's block waits for the flags of all sources, then reads with L1 bypassed. Flags only
// grow, so waiting is "flag >= this call's flag".
//
// A receiver zeroes the bulk data it consumed: LL packets of a later call land in the same
// areas, and stale plain data must never look like a packet carrying that call's flag.

__device__ __forceinline__ uint32_t* block_flag(char* region, int phase, int src, int block) {
  return (uint32_t*)(region + kArrivalBytes) + ((size_t)phase * kMaxRanks + src) * kMaxBlocks + block;
}

__device__ __forceinline__ void signal_block(const GroupArgs& g, const Call& c, int phase) {
  __syncthreads();  // the block's stores happen before the fence below
  if (threadIdx.x < g.nranks && threadIdx.x != g.me) {
    __threadfence_system();
    uint32_t* f = block_flag(g.regions[threadIdx.x], phase, g.me, blockIdx.x);
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(f), "r"(c.flag) : "memory");
  }
}

__device__ __forceinline__ void wait_block(const GroupArgs& g, const Call& c, const Deadline& dl, int phase, int op) {
  if (threadIdx.x < g.nranks && threadIdx.x != g.me) {
    const uint32_t* f = block_flag(g.regions[g.me], phase, threadIdx.x, blockIdx.x);
    int spins = 0;
    while (true) {
      uint32_t v;
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
      if ((int32_t)(v - c.flag) >= 0) break;
      if ((++spins & 63) == 0 && dl.give_up(g, op, threadIdx.x)) break;
    }
  }
  __syncthreads();
}

// Read a unit a peer wrote (L2, not a possibly stale L1 line), then zero it (see above).
__device__ __forceinline__ uint4 take_unit(uint4* p) {
  uint4 v = __ldcg(p);
  __stcg(p, make_uint4(0, 0, 0, 0));
  return v;
}

// -- LL packets -------------------------------------------------------------------------------

__device__ __forceinline__ void put_packet(uint4* dst, uint2 data, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(data.x), "r"(flag),
               "r"(data.y), "r"(flag)
               : "memory");
}

__device__ __forceinline__ bool try_get_packet(const uint4* src, uint32_t flag, uint2& data) {
  uint32_t d0, f0, d1, f1;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
               : "l"(src)
               : "memory");
  data = make_uint2(d0, d1);
  return f0 == flag && f1 == flag;
}

// Waits for the packets of every source whose bit is set in `pending`, polling them all at
// once (a sequential wait would add one memory latency per source).
// Source s is group member member_base + s (for error reports).
__device__ __forceinline__ void get_packets(const uint4* const (&src)[kMaxRanks], uint32_t pending, uint32_t flag,
                                            uint2 (&data)[kMaxRanks], const GroupArgs& g,
                                            const Deadline& dl, int op, int member_base) {
  int spins = 0;
  while (pending) {
#pragma unroll
    for (int s = 0; s < kMaxRanks; ++s) {
      if ((pending >> s) & 1u) {
        if (try_get_packet(src[s], flag, data[s])) pending &= ~(1u << s);
      }
    }
    if (pending && (++spins & 15) == 0 && dl.give_up(g, op, member_base + __ffs(pending) - 1)) return;
  }
}

__device__ __forceinline__ uint2 get_packet(const uint4* src, uint32_t flag, const GroupArgs& g,
                                            const Deadline& dl, int op, int member) {
  uint2 data = make_uint2(0, 0);
  int spins = 0;
  while (!try_get_packet(src, flag, data)) {
    if ((++spins & 15) == 0 && dl.give_up(g, op, member)) break;
  }
  return data;
}

// -- 8-byte lanes of T, accumulated in fp32 ----------------------------------------------------

template <typename T>
struct Lane;

template <>
struct Lane<float> {
  static constexpr int kN = 2;
  __device__ __forceinline__ static void unpack(uint2 v, float (&f)[4]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
  }
  __device__ __forceinline__ static uint2 pack(const float (&f)[4]) {
    return make_uint2(__float_as_uint(f[0]), __float_as_uint(f[1]));
  }
};

template <>
struct Lane<__half> {
  static constexpr int kN = 4;
  __device__ __forceinline__ static void unpack(uint2 v, float (&f)[4]) {
    float2 a = __half22float2(*reinterpret_cast<__half2*>(&v.x));
    float2 b = __half22float2(*reinterpret_cast<__half2*>(&v.y));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  }
  __device__ __forceinline__ static uint2 pack(const float (&f)[4]) {
    __half2 a = __floats2half2_rn(f[0], f[1]);
    __half2 b = __floats2half2_rn(f[2], f[3]);
    return make_uint2(*reinterpret_cast<uint32_t*>(&a), *reinterpret_cast<uint32_t*>(&b));
  }
};

template <>
struct Lane<__nv_bfloat16> {
  static constexpr int kN = 4;
  __device__ __forceinline__ static void unpack(uint2 v, float (&f)[4]) {
    float2 a = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v.x));
    float2 b = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v.y));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  }
  __device__ __forceinline__ static uint2 pack(const float (&f)[4]) {
    __nv_bfloat162 a = __floats2bfloat162_rn(f[0], f[1]);
    __nv_bfloat162 b = __floats2bfloat162_rn(f[2], f[3]);
    return make_uint2(*reinterpret_cast<uint32_t*>(&a), *reinterpret_cast<uint32_t*>(&b));
  }
};

// Sum of lanes in source order, fp32: ((v0 + v1) + v2) + ... -- the reference's order, so the
// bits match it. The first source initialises the sum (0 + -0 would lose the sign of zero).
template <typename T>
__device__ __forceinline__ void sum_lanes(const uint2 (&v)[kMaxRanks], int n, float (&acc)[4]) {
  Lane<T>::unpack(v[0], acc);
#pragma unroll
  for (int s = 1; s < kMaxRanks; ++s) {
    if (s < n) {
      float f[4];
      Lane<T>::unpack(v[s], f);
#pragma unroll
      for (int k = 0; k < Lane<T>::kN; ++k) acc[k] += f[k];
    }
  }
}

// Lane i summed over sources 0..n-1 in order, in fp32. Source `self` (-1: none) is `local`;
// the others are packets in my area `phase`, source s being group member member_base + s.
template <typename T>
__device__ __forceinline__ void sum_sources(const GroupArgs& g, const Call& c, const Deadline& dl, int op, int phase,
                                            int n, int self, int member_base, int64_t i, uint2 local,
                                            float (&acc)[4]) {
  const uint4* src[kMaxRanks];
  uint2 data[kMaxRanks];
  uint32_t pending = 0;
#pragma unroll
  for (int s = 0; s < kMaxRanks; ++s) {
    src[s] = nullptr;
    data[s] = local;
    if (s < n && s != self) {
      src[s] = area(g, g.regions[g.me], c.slot, phase, member_base + s) + i;
      pending |= 1u << s;
    }
  }
  get_packets(src, pending, c.flag, data, g, dl, op, member_base);
  sum_lanes<T>(data, n, acc);
}

// The same, rounded once to T.
template <typename T>
__device__ __forceinline__ uint2 reduce_sources(const GroupArgs& g, const Call& c, const Deadline& dl, int op,
                                                int phase, int n, int self, int member_base, int64_t i,
                                                uint2 local) {
  float acc[4];
  sum_sources<T>(g, c, dl, op, phase, n, self, member_base, i, local, acc);
  return Lane<T>::pack(acc);
}

// -- sizes ---------------------------------------------------------------------------------------

// Row counts and offsets of up to kMaxRanks members.
struct RowCounts {
  int64_t count[kMaxRanks];
  int64_t offset[kMaxRanks + 1];
  int64_t max;
};

__device__ __forceinline__ RowCounts load_counts(const SizesArg& s, int n) {
  RowCounts r;
  r.offset[0] = 0;
  r.max = 0;
#pragma unroll
  for (int i = 0; i < kMaxRanks; ++i) {
    int64_t c = 0;
    if (i < n) c = s.device ? (int64_t)max(s.device[i], 0) : (int64_t)s.host[i];
    r.count[i] = c;
    r.offset[i + 1] = r.offset[i] + c;
    r.max = c > r.max ? c : r.max;
  }
  return r;
}

// Row counts, checked against the area size. Every rank reaches the same verdict (same sizes,
// same area size), so on overflow nobody sends and nobody waits: the counts become zero and
// the error is recorded for the host (CapacityExceeded).
__device__ __forceinline__ RowCounts load_counts_checked(const GroupArgs& g, const SizesArg& s, int n,
                                                         int64_t row_lanes, int op) {
  RowCounts rc = load_counts(s, n);
  if (rc.max * row_lanes * 16 > (int64_t)g.area_bytes) {
    if (grid_thread() == 0) record_error(g, kCapacity, op, g.me);
    rc = RowCounts{};
  }
  return rc;
}

// Counts beyond this rank's own buffers: every access is guarded, so record and carry on
// (the peers still get their packets and nobody waits forever).
__device__ __forceinline__ void check_buffers(const GroupArgs& g, bool overflow, int op) {
  if (overflow && grid_thread() == 0) record_error(g, kCapacity, op, g.me);
}

// Rows [begin, end) of `rows` owned by part p of `parts` (the cut of arguments.split_evenly).
__device__ __forceinline__ int64_t chunk_begin(int64_t rows, int p, int parts) { return rows * p / parts; }

// Which part owns row r (< rows) of `rows` cut into `parts`: the largest p with
// chunk_begin(rows, p, parts) <= r, i.e. p * rows < (r + 1) * parts.
__device__ __forceinline__ int chunk_owner(int64_t r, int64_t rows, int parts) {
  return (int)(((r + 1) * parts - 1) / rows);
}


}  // namespace hc
