// The quantized gathers' row work, shared by their LL kernel (quant_gather.cu) and their
// Lamport kernel (lamport_quant_gather.cu): who owns a row, staging a row (the reduction over
// attention TP, the fused add + RMSNorm) and quantizing it into 8-byte wire lanes. The two
// kernels differ only in how the quantized lanes travel.
//
// Ownership: the group has `tp` ranks per DP group (d = me / tp; all_gather_v runs with tp = 1,
// one member per "group"). Each row has exactly one owner, the tp rank whose chunk holds it
// (arguments.split_evenly); the owner quantizes the row and sends it to every other rank.
//
// Who sums a DP group's partial rows (tp > 1, partial) -- kQuantGatherOwner / kQuantGatherOneHop:
//   owner      : the row's owner alone. Partial lanes go to it (phase 0), it sends the quantized
//                row to every other rank: two hops for everyone, fewest bytes.
//   replicated : every tp rank, each for every row of its DP group (the one-hop algorithm, and
//                fused rows, which every tp rank stages anyway for the residual output). Partial
//                lanes go to every tp peer; each tp rank keeps its own quantized copy (the same
//                bits: the same sum in tp order, the same code), and the owner sends the row only
//                outside its DP group. One hop inside the group; (tp - 1) x the partial bytes.
#pragma once

#include <type_traits>

#include "block_reduce.cuh"
#include "launch.cuh"
#include "quant.cuh"

namespace hc {

// Where quantized rows land: out_rows rows of data (8-byte lanes) and of scale bytes. Both
// kernels' wire rows are the data lanes, then the scale bytes, padded.
struct QuantOut {
  int64_t data_lanes, scale_bytes, out_rows;
  uint2* __restrict__ data;      // out_rows x data_lanes lanes
  uint8_t* __restrict__ scales;  // out_rows x scale_bytes

  // Scale bytes [b, b + N) of row o (< out_rows) from v's bytes; those past the row's are padding.
  template <typename V>
  __device__ __forceinline__ void store_scales(int64_t o, int64_t b, const V& v) const {
    constexpr int N = (int)sizeof(V);
    if (scale_bytes % 4 == 0) {  // all but nvfp4 rows of hidden / 16 not a multiple of 4: words
      const uint32_t* words = reinterpret_cast<const uint32_t*>(&v);
      uint32_t* dst = reinterpret_cast<uint32_t*>(scales + o * scale_bytes + b);
#pragma unroll
      for (int k = 0; k < N / 4; ++k)
        if (b + 4 * k < scale_bytes) dst[k] = words[k];
      return;
    }
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&v);
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (b + k < scale_bytes) scales[o * scale_bytes + b + k] = bytes[k];
  }
};

template <int F>
__host__ __device__ __forceinline__ QuantOut quant_out(int64_t hidden, void* data, void* scales, int64_t out_rows) {
  const int64_t scale_bytes = (QuantTraits<F>::kBlock ? hidden / QuantTraits<F>::kBlock : 1) * QuantTraits<F>::kScaleBytes;
  return QuantOut{hidden / QuantTraits<F>::kPerLane, scale_bytes, out_rows, (uint2*)data, (uint8_t*)scales};
}

__device__ __forceinline__ int owner_of(const TokenShape& s, int d, int64_t j) {
  return d * s.tp + chunk_owner(j, s.rc.count(d), s.tp);
}

__device__ __forceinline__ int group_of_row(const TokenShape& s, int64_t o) { return s.rc.holder(o, s.dp, 1); }

// What a kernel instance does to rows besides quantizing them, a template argument of both
// kernels: each instance holds only its own paths' code. With every path in one body the
// kernels were 80-143 KB of SASS an instance (the unquantized gathers: 22-56 KB), and a
// 1-token call spent ~0.5 us on each few dozen instructions (trace: a block max 0.48 us, the
// nvfp4 codes of one row 2.1 us), as if fetched from L2 (readelf of the cubin; docs/latency.md).
//   kRowsPlain   : rows as they are (attn_tp = 1, or replicated input rows);
//   kRowsReduced : partial rows summed over attn_tp first (phase 0);
//   kRowsFused   : residual add + RMSNorm (partial or not: decided at run time).
enum RowMode : int { kRowsPlain = 0, kRowsReduced = 1, kRowsFused = 2 };

inline int row_mode(bool fused, int partial, int tp) {
  return fused ? kRowsFused : partial && tp > 1 ? kRowsReduced : kRowsPlain;
}

// One call's row work, derived once from its RowMode (the kernels' template argument, so there
// the flags fold to constants), the QuantGatherAlgorithm, attn_tp and whether rows are partial;
// read by the kernels and their launchers alike.
struct RowPlan {
  bool fused;          // residual add + RMSNorm
  bool reduce;         // partial rows summed over tp first (phase 0)
  bool replicated;     // every tp rank sums and quantizes every row of its DP group (top of the file)
  bool every_row;      // a rank stages every row of its DP group (fused, replicated), else its chunk
  bool from_row_zero;  // a team's first row is row row_team(): loaded before arrive() (early_row_input)
};

__host__ __device__ __forceinline__ RowPlan row_plan(int mode, int algorithm, int tp, int partial) {
  RowPlan p;
  p.fused = mode == kRowsFused;
  p.reduce = mode == kRowsReduced || (p.fused && partial && tp > 1);
  p.replicated = p.reduce && (p.fused || algorithm == kQuantGatherOneHop);
  p.every_row = p.fused || p.replicated;
  p.from_row_zero = tp == 1 || p.every_row;
  return p;
}

// f(peer) for every rank that receives the rows I own: every other rank, or (replicated) every
// rank outside my DP group, whose tp ranks quantize their own copies.
template <typename F>
__device__ __forceinline__ void for_each_receiver(const CallCtx& cx, const TokenShape& s, bool replicated, F f) {
  cx.everyone().for_each_other([&](int peer) {
    if (!replicated || (unsigned)(peer - s.d * s.tp) >= (unsigned)s.tp) f(peer);
  });
}

// -- a row team ----------------------------------------------------------------------------------
// A row is worked by a team of W consecutive threads of the grid (W: a kernel instance's
// template argument, team_threads). Most teams are one block of W = kThreads threads. Where
// splits_rows allows, a team is 2 or 4 blocks of 256 or 128 threads (quant_grid), so that a call
// of few rows spreads over more SMs (launch.cuh spread_grid: why that pays). In the Lamport kernel
// plain rows of at most 256 or 128 data lanes have teams of W = 256 or 128 (team_threads): two or
// four teams share a 512-thread block, so that no team holds half a team of threads without a
// lane. Team row_team() works rows first + row_team(), then row_teams() on; its thread
// row_thread() holds the data lanes below.
__device__ __forceinline__ uint32_t team_grid_thread() { return blockIdx.x * blockDim.x + threadIdx.x; }
template <int W>
__device__ __forceinline__ int64_t row_teams() { return gridDim.x * blockDim.x / W; }
// Narrow teams are numbered first parts first: team t < row_teams() * W / kThreads is the first
// part of the grid's t-th kThreads threads, where a team of kThreads would have worked
// (quant_grid sizes the grid for those: a whole number of kThreads), so that a call of fewer rows
// than that puts them on the same blocks. Numbered in grid order instead, the rows of a 33-token
// call sat two to a block on the first 17 blocks, which also hold the receive loop's items, and
// it took 1.10-1.18x the time (run 83 of results/shared_1xH100).
template <int W>
__device__ __forceinline__ int64_t row_team() {
  constexpr int kPerFullTeam = kThreads / W;
  const int64_t h = team_grid_thread() / W;
  return h % kPerFullTeam * (row_teams<W>() / kPerFullTeam) + h / kPerFullTeam;
}
template <int W>
__device__ __forceinline__ int row_thread() { return (int)(team_grid_thread() % W); }
template <int W>
__device__ __forceinline__ bool team_split() { return blockDim.x < W; }
// Whether a block holds several teams, whose barriers must then be the team's own (team_any).
template <int W>
__device__ __forceinline__ bool team_shares_block() { return W < kThreads && blockDim.x > W; }

// The team's threads in this block meet (a named barrier per team: a block of several teams
// must not wait for a team that works a row fewer) and learn whether any of them has `v`. A
// split team's blocks each decide alone, as __syncthreads_or does for a team of one block.
template <int W>
__device__ __forceinline__ bool team_any(bool v) {
  if (!team_shares_block<W>()) return __syncthreads_or(v) != 0;
  uint32_t any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n"
      " selp.u32 %0, 1, 0, q;\n}"
      : "=r"(any)
      : "r"((uint32_t)v), "r"(1 + (int)threadIdx.x / W), "r"(W)
      : "memory");
  return any != 0;
}

// The largest v over the team's threads in this block (block_max, team by team where a block
// holds several: warp_buf's entries of the team's warps, each team at its own named barrier).
template <int W>
__device__ __forceinline__ float team_max(float v, float* warp_buf) {
  if (!team_shares_block<W>()) return block_max(v, warp_buf);
  v = group_max(v, 32);
  const int lane = threadIdx.x & 31, first_warp = (int)(threadIdx.x / W) * (W / 32);
  const auto meet = [&] { asm volatile("bar.sync %0, %1;" ::"r"(1 + (int)threadIdx.x / W), "r"(W) : "memory"); };
  if (lane == 0) warp_buf[threadIdx.x >> 5] = v;
  meet();
  const float m = group_max(warp_buf[first_warp + (lane < W / 32 ? lane : 0)], 32);
  meet();  // warp_buf is reused by the next row
  return m;
}

// fp8 rows of a split team: each block takes the row's max (the token's scale) itself, over the
// row's whole input -- each thread its share, lanes threadIdx.x + j * blockDim.x, j < kShareLoads
// -- so that no block waits for another. The share is loaded with the thread's own lanes
// (load_row_input): for a team's first row before arrive(), its latency hidden by the prologue's.
// Loaded after the row's values instead, it lost more than the split saved (runs 55-56 of
// results/shared_1xH100, fp8_row_teams_late_reread.patch there). Rows of at most kShareLoads x
// 128 input lanes: 16-bit rows up to hidden 4096 (one data lane a thread).
constexpr int kShareLoads = 8;

// Whether a call's teams may span several blocks: plain rows (no sum over tp, no norm: nothing
// that a block a row shares through shared memory) of a block format (its scales come from one
// warp's lanes), or of fp8 whose row fits one share (above).
template <int F>
inline bool splits_rows(int mode, int64_t row_lanes) {
  return mode == kRowsPlain && (QuantTraits<F>::kBlock != 0 || row_lanes <= kShareLoads * kSpreadBlockThreads[0]);
}

// -- a row in registers ----------------------------------------------------------------------------
// Thread x of the team holds data lanes x + k * kThreads (k < KL <= kLanesPerThread: every
// hidden size up to kMaxQuantHidden) of the row it works on: their input as loaded, then their
// fp32 values. Kernels are instantiated per KL = ceil(data lanes / kThreads)
// (with_lanes_per_thread): a thread's registers hold no lane a row cannot have (the kernels
// already needed ~124 registers; at the largest KL for every hidden size, bf16 ones spilled).
// Registers rather than a row staged in shared memory: the input of a block's first row is
// loaded before arrive() (as rows.cuh's EarlyInput), the next row's while this one is quantized,
// and a thread quantizes the values it loaded (trace, 2x H200, fp8 1 token: staging the row through
// shared memory, the row max over it and a barrier before the scale lane took ~3 us of the ~4.3 us
// from arrive() to sent). Consecutive threads hold consecutive lanes, so the block formats' blocks
// (16 lanes of fp8_block128) and the wire's scale lanes and Lamport units are formed by warp
// shuffles, never through shared memory.
template <int F>
constexpr int kLanesPerThread = (kMaxQuantHidden / QuantTraits<F>::kPerLane + kThreads - 1) / kThreads;

// Data lane k of this thread (k < KL) in a team of W threads.
template <int W>
__device__ __forceinline__ int64_t my_lane(int k) { return (int64_t)row_thread<W>() + (int64_t)k * W; }

// The input lanes (8 bytes of T) of a thread's data lanes of one row, as loaded; in an instance
// whose teams may split (S: plain rows), an fp8 row of one lane a thread also holds the thread's
// share of the whole row's input (kShareLoads). Not in the others: their registers would carry a
// share they never load (the reduced fp8 rows of fp32 started to spill with it).
template <typename T, int F, int KL, bool S>
struct RowInput {
  static constexpr int kK = KL, kIn = QuantTraits<F>::kPerLane / Lane<T>::kN;
  static constexpr int kShare = S && F == kQuantFp8 && KL == 1 ? kShareLoads : 0;
  uint2 raw[kK][kIn];
  uint2 share[kShare > 0 ? kShare : 1];
};

// Row r of `in` (zeros at in_rows and beyond, and past data_lanes): the input of my data lanes.
template <typename T, int F, int KL, int W, bool S>
__device__ __forceinline__ RowInput<T, F, KL, S> load_row_input(const uint2* __restrict__ in, int64_t r,
                                                            const RowsArg& io, int64_t data_lanes) {
  using In = RowInput<T, F, KL, S>;
  In x;
#pragma unroll
  for (int k = 0; k < In::kK; ++k) {
    const int64_t l = my_lane<W>(k);
    const bool ok = r < io.in_rows && l < data_lanes;
#pragma unroll
    for (int j = 0; j < In::kIn; ++j) x.raw[k][j] = ok ? in[r * io.row_lanes + l * In::kIn + j] : make_uint2(0, 0);
  }
  if constexpr (In::kShare > 0) {
    if (!team_split<W>()) return x;
#pragma unroll
    for (int j = 0; j < In::kShare; ++j) {
      const int64_t i = (int64_t)threadIdx.x + (int64_t)j * blockDim.x;
      x.share[j] = r < io.in_rows && i < io.row_lanes ? in[r * io.row_lanes + i] : make_uint2(0, 0);
    }
  }
  return x;
}

// The largest |value| of a split team's fp8 row over this thread's share (load_row_input): the
// block max of these is the row's max, exact, so the row has the bits of a row of one block.
template <typename T, int F, int KL, bool S>
__device__ __forceinline__ float share_amax(const RowInput<T, F, KL, S>& x) {
  float a = 0.f;
#pragma unroll
  for (int j = 0; j < RowInput<T, F, KL, S>::kShare; ++j) {
    float v[4];
    Lane<T>::unpack(x.share[j], v);
#pragma unroll
    for (int e = 0; e < Lane<T>::kN; ++e) a = fmaxf(a, fabsf(v[e]));
  }
  return a;
}

// The fp32 values of a thread's data lanes (zeros past the row's). `others`: of a split team's
// fp8 row, the largest |value| of the thread's share of the whole row (share_amax), else 0.
template <int F, int KL>
struct RowValues {
  static constexpr int kK = KL, kN = QuantTraits<F>::kPerLane;
  float v[kK][kN];
  float others = 0.f;
};

// My input lanes' values: summed over tp (reduce: the partial lanes of my DP group's other tp
// ranks arrive in LL area 0, summed in tp order and rounded once to T, as stage_row does), or
// as they are. Row r of my group; `x` its input, loaded by load_row_input.
template <typename T, int F, int KL, int W, bool S>
__device__ __forceinline__ RowValues<F, KL> row_values(const CallCtx& cx, const TokenShape& s, bool reduce, int64_t r,
                                                       RowInput<T, F, KL, S> x, int64_t data_lanes) {
  using In = RowInput<T, F, KL, S>;
  constexpr int kN = Lane<T>::kN;
  if (reduce) {
    // One wait at a time, in a loop that is not unrolled: one copy of the wait's code (unrolled,
    // its copies made ptxas take minutes and spill); the lane is read and written back by
    // selection, so x stays in registers.
#pragma unroll 1
    for (int q = 0; q < KL * In::kIn; ++q) {
      if (my_lane<W>(q / In::kIn) >= data_lanes) continue;
      uint2 local = x.raw[0][0];
#pragma unroll
      for (int p = 1; p < KL * In::kIn; ++p) local = p == q ? x.raw[p / In::kIn][p % In::kIn] : local;
      float acc[4];
      sum_sources<T>(cx, 0, s.tp, s.t, s.d * s.tp, (r * data_lanes + my_lane<W>(q / In::kIn)) * In::kIn + q % In::kIn,
                     local, acc);
      const uint2 sum = Lane<T>::pack(acc);  // rounded once to T
#pragma unroll
      for (int p = 0; p < KL * In::kIn; ++p) {
        if (p == q) x.raw[p / In::kIn][p % In::kIn] = sum;
      }
    }
  }
  RowValues<F, KL> out;
#pragma unroll
  for (int k = 0; k < KL; ++k) {
#pragma unroll
    for (int j = 0; j < In::kIn; ++j) {
      float v[4];
      Lane<T>::unpack(x.raw[k][j], v);
#pragma unroll
      for (int e = 0; e < kN; ++e) out.v[k][j * kN + e] = v[e];
    }
  }
  return out;
}

// My data lanes' values of the row staged in shared memory (the fused path: stage_row).
template <int F, int KL, int W>
__device__ __forceinline__ RowValues<F, KL> staged_values(const float* row, int64_t data_lanes) {
  using Values = RowValues<F, KL>;
  Values out;
#pragma unroll
  for (int k = 0; k < KL; ++k) {
    const bool ok = my_lane<W>(k) < data_lanes;
#pragma unroll
    for (int e = 0; e < Values::kN; ++e) out.v[k][e] = ok ? row[my_lane<W>(k) * Values::kN + e] : 0.f;
  }
  return out;
}

// -- quantize and emit ---------------------------------------------------------------------------

// Data lanes per 8-byte scale lane of the wire (fp8: lane 0 holds the token's scale; nvfp4: one
// e4m3 byte per data lane; fp8_block128: one fp32 per 16 data lanes): scale lane s is formed and
// emitted by the thread holding data lane s * kScaleLaneStride.
template <int F>
constexpr int kScaleLaneStride = F == kQuantNvfp4 ? 8 : F == kQuantFp8Block128 ? 32 : 1;

// The scale lane starting at my data lane l (of a warp's consecutive lanes l - lane % stride ..),
// formed by shuffles: every thread of the warp calls this. `scale_bits`: my lane's scale (nvfp4:
// its e4m3 byte; fp8_block128: its block's fp32 bits; fp8: the token's fp32 bits), zero for
// lanes past the row's, so the lane's padding is zero.
template <int F>
__device__ __forceinline__ uint2 scale_lane_at(int64_t l, uint32_t scale_bits) {
  if constexpr (F == kQuantNvfp4) {  // bytes of 8 consecutive lanes
    const int b = (int)(l & 7);
    uint32_t lo = b < 4 ? scale_bits << (8 * b) : 0u, hi = b < 4 ? 0u : scale_bits << (8 * (b - 4));
#pragma unroll
    for (int m = 1; m < 8; m <<= 1) {
      lo |= __shfl_xor_sync(0xffffffffu, lo, m);
      hi |= __shfl_xor_sync(0xffffffffu, hi, m);
    }
    return make_uint2(lo, hi);
  } else if constexpr (F == kQuantFp8Block128) {  // this block's scale and the next one's (16 lanes on)
    return make_uint2(scale_bits, __shfl_down_sync(0xffffffffu, scale_bits, 16));
  } else {  // the token's scale in scale lane 0; lane 1 (a Lamport unit's second half) is padding
    return make_uint2(l == 0 ? scale_bits : 0u, 0u);
  }
}

// A row's wire lanes as quantized, in registers (quantize_lanes), until they are emitted
// (emit_lanes): data[k] is my data lane my_lane(k) (zeros past the row's), scale[k] the wire's
// scale lane that starts at it (formed by shuffles; meaningful where my_lane(k) is a multiple of
// kScaleLaneStride). Held apart so that a row can go to its receivers before my own output
// row's place is known (stage_my_rows: own-count mode).
template <int KL>
struct QuantizedLanes {
  uint2 data[KL], scale[KL];
};

// My data lanes of a row (values x) quantized. One block max for fp8 (the token's amax; with
// x.others, the whole row's when the team is split); the block formats' scales come from
// shuffles, in warps of the row's consecutive lanes. Every thread of the team calls this
// (block max, shuffles).
template <int F, int KL, int W>
__device__ __forceinline__ QuantizedLanes<KL> quantize_lanes(const RowValues<F, KL>& x, int64_t data_lanes,
                                                             float global_scale, float* warp_buf) {
  constexpr int kK = KL, kN = RowValues<F, KL>::kN;
  float amax[kK];
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    amax[k] = 0.f;
#pragma unroll
    for (int e = 0; e < kN; ++e) amax[k] = fmaxf(amax[k], fabsf(x.v[k][e]));
  }
  Fp8Scale token{0.f, 0.f};
  if constexpr (F == kQuantFp8) {
    float a = fmaxf(x.others, amax[0]);
#pragma unroll
    for (int k = 1; k < kK; ++k) a = fmaxf(a, amax[k]);
    token = fp8_scale(team_max<W>(a, warp_buf));
  }
  QuantizedLanes<KL> q;
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    q.data[k] = q.scale[k] = make_uint2(0, 0);
    if ((int64_t)k * W >= data_lanes) continue;  // uniform over the team
    const int64_t l = my_lane<W>(k);
    const bool mine = l < data_lanes;
    // The codes and nvfp4's lane scale only where the lane is the row's (half a team's threads
    // hold none at nvfp4 4096): computed by every thread and selected after, they cost ~270
    // instructions a warp where a barrier separated them from the emits (ncu, run 74 of
    // results/shared_1xH100).
    const float block = F == kQuantFp8Block128 ? group_max(amax[k], 16) : 0.f;  // (a shuffle: every thread)
    uint32_t scale_bits = 0u;
    if (mine) {
      uint32_t w[2] = {0u, 0u};
      if constexpr (F == kQuantNvfp4) {  // a lane is exactly one 16-block
        const Nvfp4Scale sc = nvfp4_scale(amax[k], global_scale);
        static_assert(kN == 16, "an nvfp4 lane is two words of eight codes");
        w[0] = nvfp4_codes<8>(&x.v[k][0], sc.inv);
        w[1] = nvfp4_codes<8>(&x.v[k][8], sc.inv);
        scale_bits = sc.sf;
      } else {
        const Fp8Scale sc = F == kQuantFp8Block128 ? fp8_scale(block) : token;
#pragma unroll
        for (int e = 0; e < kN; e += 2) w[e / 4] |= fp8_codes(x.v[k][e], x.v[k][e + 1], sc.inv) << (8 * (e % 4));
        scale_bits = __float_as_uint(sc.scale);
      }
      q.data[k] = make_uint2(w[0], w[1]);
    }
    q.scale[k] = scale_lane_at<F>(l, scale_bits);
  }
  return q;
}

// A quantized row's lanes emitted, K lanes an item: emit_data(i, v) with v data lanes K*i ..
// K*i + K - 1 (zeros past data_lanes; K = 2: the partner lane comes from the next thread by a
// shuffle, and even threads emit), then emit_scale(s, v) for the wire's scale lanes s <
// scale_lanes (8 bytes each; zeros past the row's scale bytes). Every thread of the team calls
// this (shuffles); no barrier follows the emits.
template <int F, int K, int KL, int W, typename EmitData, typename EmitScale>
__device__ __forceinline__ void emit_lanes(const QuantizedLanes<KL>& q, int64_t data_lanes, int64_t scale_lanes,
                                           EmitData emit_data, EmitScale emit_scale) {
  static_assert(K == 1 || K == 2, "an item is one lane or a pair of lanes");
#pragma unroll
  for (int k = 0; k < KL; ++k) {
    if ((int64_t)k * W >= data_lanes) break;  // uniform over the team
    const int64_t l = my_lane<W>(k);
    const bool mine = l < data_lanes;
    if constexpr (K == 1) {
      if (mine) emit_data(l, {q.data[k]});
    } else {
      const uint2 lane = q.data[k];
      const uint2 next = make_uint2(__shfl_down_sync(0xffffffffu, lane.x, 1), __shfl_down_sync(0xffffffffu, lane.y, 1));
      if (mine && l % 2 == 0) emit_data(l / 2, {lane, next});  // (past the row's, next is zero)
    }
    const int64_t sl = l / kScaleLaneStride<F>;
    if (l % kScaleLaneStride<F> == 0 && sl < scale_lanes) emit_scale(sl, q.scale[k]);
  }
}

// Where a quantized row's emits go (the kernels' send functions, called by stage_my_rows): to
// the ranks that receive it, into my output, or both. A row's receivers place it by its index in my group's rows; my output, by my group's
// offset, which in own-count mode is known only after the exchange.
enum EmitTo : int { kToReceivers = 1, kToMine = 2, kToBoth = 3 };

// Row r of my group into `row` (fp32, staged): summed over tp (reduce; partial lanes arrive in
// LL area 0), plus the residual and RMSNorm when fused (residual_out written), rounded to T as
// the reference's result is.
// `early`: row row_team()'s lanes of this thread, loaded before arrive() (early_row_input: lane
// threadIdx.x + m * kThreads is early.raw[m / kIn][m % kIn]). A team of one block (kThreads).
template <typename T, int F, int KL, bool S>
__device__ __forceinline__ void stage_row(const CallCtx& cx, const TokenShape& s, bool reduce, int64_t r,
                                          const uint2* __restrict__ in, const RowInput<T, F, KL, S>& early,
                                          const uint2* __restrict__ residual, const uint2* __restrict__ weight,
                                          uint2* __restrict__ residual_out, float eps, const RowsArg& io, float* row,
                                          float* warp_buf) {
  using In = RowInput<T, F, KL, S>;
  constexpr int kN = Lane<T>::kN;
  // (fused, every row of the group is staged: the team's first row is r == row_team())
  const bool in_bounds = r < io.in_rows, fused = weight != nullptr, early_row = r == row_team<kThreads>();
  float sumsq = 0.f;
  int m = 0;  // (kThreads == blockDim.x)
  for (int64_t l = threadIdx.x; l < s.row_lanes; l += blockDim.x, ++m) {
    const int64_t i = r * s.row_lanes + l;
    uint2 local = in_bounds && !early_row ? in[i] : make_uint2(0, 0);
#pragma unroll
    for (int p = 0; p < KL * In::kIn; ++p) local = early_row && p == m ? early.raw[p / In::kIn][p % In::kIn] : local;
    float acc[4];
    if (reduce) sum_sources<T>(cx, 0, s.tp, s.t, s.d * s.tp, i, local, acc);
    else Lane<T>::unpack(local, acc);
    if (fused) {  // the residual joins the fp32 sum before its single rounding (norm.py)
      float res[4];
      Lane<T>::unpack(in_bounds ? residual[i] : make_uint2(0, 0), res);
#pragma unroll
      for (int k = 0; k < kN; ++k) acc[k] += res[k];
    }
    const uint2 packed = Lane<T>::pack(acc);
    if (fused && in_bounds) residual_out[i] = packed;
    Lane<T>::unpack(packed, acc);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      sumsq += acc[k] * acc[k];
      row[l * kN + k] = acc[k];
    }
  }
  if (!fused) return;
  // RMSNorm as gather_fused computes it (same operations, same order: the same bits).
  const float inv_hidden = 1.0f / (float)(s.row_lanes * kN);
  const float scale = 1.0f / sqrtf(block_sum(sumsq, warp_buf) * inv_hidden + eps);
  for (int64_t l = threadIdx.x; l < s.row_lanes; l += blockDim.x) {
    float v[4], w[4];
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] = row[l * kN + k];
    Lane<T>::unpack(weight[l], w);
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] = v[k] * scale * w[k];
    Lane<T>::unpack(Lane<T>::pack(v), v);
#pragma unroll
    for (int k = 0; k < kN; ++k) row[l * kN + k] = v[k];
  }
}

// Phase 0 of both kernels (tp > 1, partial rows): my partial lanes of rows first_row.. to the
// rank(s) that sum them -- the row's owner, or (replicated) every tp peer.
__device__ __forceinline__ void send_partial_lanes(const CallCtx& cx, const TokenShape& s, bool replicated,
                                                   const uint2* __restrict__ in, int64_t in_lanes, int64_t first_row) {
  const int64_t rows = s.rc.count(s.d);
  for (int64_t i = first_row * s.row_lanes + grid_thread(); i < rows * s.row_lanes; i += grid_threads()) {
    const uint2 v = i < in_lanes ? in[i] : make_uint2(0, 0);
    if (replicated) {
      push_to_peers(cx, s.tp_group(), 0, i, v);
      continue;
    }
    const int owner = owner_of(s, s.d, quot(i, s.row_lanes));
    if (owner != cx.g.me) put_lane(cx, owner, 0, i, v);
  }
}

// Replicated, not fused: my partial input lanes of row row_team() (my team's first row), from the
// registers early_row_input loaded them into, to every tp peer (LL area 0, at send_partial_lanes'
// lane indices), right after arrive(). Through shared memory (`staging`, the unfused kernels'
// unused row buffer), so that a warp's stores cover consecutive lanes: stored from the registers
// directly (consecutive threads' lanes kIn apart), 16-token TP2 calls took 10.0 us, not 8.0.
template <typename T, int F, int KL, bool S>
__device__ __forceinline__ void push_first_row(const CallCtx& cx, const TokenShape& s, const RowInput<T, F, KL, S>& x,
                                               int64_t data_lanes, uint2* staging) {
  using In = RowInput<T, F, KL, S>;
  const int64_t r = row_team<kThreads>();  // (summed rows: a team of one block)
  if (r >= s.rc.count(s.d)) return;  // (uniform over the block)
#pragma unroll
  for (int k = 0; k < KL; ++k) {
    if (my_lane<kThreads>(k) >= data_lanes) continue;
#pragma unroll
    for (int j = 0; j < In::kIn; ++j) staging[my_lane<kThreads>(k) * In::kIn + j] = x.raw[k][j];
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < s.row_lanes; i += blockDim.x)
    push_to_peers(cx, s.tp_group(), 0, r * s.row_lanes + i, staging[i]);
}

// The input of this block's first row, loaded before the counts and arrive() where its index is
// known without the counts: where my rows start at row 0 (tp == 1, or every row of the group
// staged: from_row_zero; else stage_my_rows loads it, at my chunk's first row). Rows not fused:
// my data lanes (load_row_input); fused: the lanes stage_row reads, threadIdx.x + m * kThreads
// (m < KL * kIn: the row has KL * kIn * kThreads lanes at most), in raw[m / kIn][m % kIn].
template <typename T, int F, int KL, int W, bool S>
__device__ __forceinline__ RowInput<T, F, KL, S> early_row_input(const uint2* __restrict__ in, bool from_row_zero,
                                                                 bool fused, const RowsArg& io, int64_t data_lanes) {
  using In = RowInput<T, F, KL, S>;
  if (!from_row_zero) return In{};
  if (!fused) return load_row_input<T, F, KL, W, S>(in, row_team<W>(), io, data_lanes);
  In x;
  const int64_t r = row_team<kThreads>();  // (fused: a team of one block)
#pragma unroll
  for (int m = 0; m < KL * In::kIn; ++m) {
    const int64_t l = (int64_t)threadIdx.x + (int64_t)m * kThreads;
    x.raw[m / In::kIn][m % In::kIn] = r < io.in_rows && l < io.row_lanes ? in[r * io.row_lanes + l] : make_uint2(0, 0);
  }
  return x;
}

// Phase 0 and the rows of both kernels: my partial lanes sent (reduce; replicated and not fused,
// each team's first row from its registers), then one row team per row I stage -- every row of
// my group when fused (the residual output) or replicated, else my chunk. Each row I quantize
// (the rows I own, and replicated every row of my group) goes out by send(r, q, owned, to),
// called by the whole team: q my lanes (quantize_lanes), owned whether the row is in my chunk,
// to an EmitTo. `next`: early_row_input's.
// learn(): every thread, before any row goes into my output (own: own-count mode, where it
// learns the others' counts, which place my rows there; own_count.cuh); after a failed exchange
// my rows count as zero, so none is kept. In own-count mode a team's first plain row goes to
// its receivers before learn() and into my output after it (below), as the bf16 gathers push
// their rows before they learn: learned first, the quantized gathers' in-kernel exchange cost
// 1.6-2.5 us a DP2 gather + scatter pair over given counts, the bf16 one 0.2-1.3
// (results/2xH200/own_counts).
// Not fused, a row is loaded into registers while the previous one is quantized and sent; fused,
// it is staged in shared memory (stage_row: the norm's sum runs in gather_fused's order, over
// lanes strided by the block).
template <typename T, int F, int KL, int W, bool S, typename Learn, typename Send>
__device__ __forceinline__ void stage_my_rows(const CallCtx& cx, const TokenShape& s, const RowPlan& plan,
                                              const uint2* __restrict__ in, const uint2* __restrict__ residual,
                                              const uint2* __restrict__ weight, uint2* __restrict__ residual_out,
                                              float eps, float global_scale, const RowsArg& io, int64_t data_lanes,
                                              RowInput<T, F, KL, S> next, float* row, float* warp_buf, bool own,
                                              Learn learn, Send send) {
  const int64_t rows = s.rc.count(s.d);
  const bool reduce = plan.reduce, fused = plan.fused, replicated = plan.replicated, every_row = plan.every_row;
  const int64_t first = every_row ? 0 : chunk_begin(rows, s.t, s.tp);
  const int64_t last = every_row ? rows : chunk_begin(rows, s.t + 1, s.tp);
  if (!every_row && s.tp > 1) next = load_row_input<T, F, KL, W, S>(in, first + row_team<W>(), io, data_lanes);
  if (reduce && !fused && replicated) {  // my first row from registers, the rest (more rows than blocks) loaded
    push_first_row<T, F, KL>(cx, s, next, data_lanes, reinterpret_cast<uint2*>(row));
    send_partial_lanes(cx, s, true, in, io.in_lanes(), row_teams<kThreads>());
  } else if (reduce) {
    send_partial_lanes(cx, s, replicated, in, io.in_lanes(), 0);
  }
  const int64_t teams = row_teams<W>();
  // Row r's values, staged; not fused, the input of my next row is loaded meanwhile.
  const auto values = [&](int64_t r) {
    RowValues<F, KL> x;
    if (fused) {
      stage_row<T, F, KL>(cx, s, reduce, r, in, next, residual, weight, residual_out, eps, io, row, warp_buf);
      __syncthreads();  // the staged row is complete
      x = staged_values<F, KL, W>(row, data_lanes);
      __syncthreads();  // read: the next row may be staged
    } else {
      const RowInput<T, F, KL, S> input = next;
      if (r + teams < last) next = load_row_input<T, F, KL, W, S>(in, r + teams, io, data_lanes);
      x = row_values<T, F, KL, W>(cx, s, reduce, r, input, data_lanes);
      if constexpr (RowInput<T, F, KL, S>::kShare > 0) {
        if (!reduce && team_split<W>()) x.others = share_amax(input);  // (a split team: plain rows)
      }
    }
    return x;
  };
  // A row's scale comes from many threads' values: none is sent if one never came (the sends
  // check cx.aborted). Checked before the quantizing, whose code the compiler then keeps in
  // the threads that hold a lane of the row.
  const auto quantized = [&](const RowValues<F, KL>& x) {
    cx.aborted = team_any<W>(cx.aborted);  // (uniform over the team)
    return quantize_lanes<F, KL, W>(x, data_lanes, global_scale, warp_buf);
  };
  // owned: the row is in my chunk (not fused: every row I stage is mine or, replicated, sent).
  const auto owned = [&](int64_t r) { return !every_row || chunk_owner(r, rows, s.tp) == s.t; };
  // Own-count mode, plain rows (not summed, not fused): a team's first row goes to its
  // receivers before learn(), and into my output after it. Only there: with summed rows the
  // first row waits for peers' partial lanes (a member whose count differs must get the
  // mismatch error, not a timeout), a fused instance would hold the staging and quantizing
  // code twice, and with given counts learn() waits for nothing: there the first row would
  // only pay a second pass of emits.
  int64_t r = first + row_team<W>();
  const bool early = own && !reduce && !fused && r < last;  // (uniform over the team)
  QuantizedLanes<KL> q0;
  if (early) {
    q0 = quantized(values(r));
    send(r, q0, true, kToReceivers);
  }
  learn();
  if (s.rc.count(s.d) != rows) return;  // (uniform: the exchange failed, every count is zero)
  if (early) {
    send(r, q0, true, kToMine);
    r += teams;
  }
  for (; r < last; r += teams) {
    const RowValues<F, KL> x = values(r);
    if (fused && !owned(r) && !replicated) continue;  // staged for the residual output only (uniform)
    send(r, quantized(x), owned(r), kToBoth);
  }
}

// Phase 1 of both kernels, grid-strided: receive(o, k, owner, j, c) for item k (of `items` a row)
// of every output row o that another rank owns (row j of its DP group, row c of its owner's
// chunk). With one rank per DP group (tp == 1) the group is the owner and the row its chunk's:
// the per-item index work is most of a small call's time from its sends to its first poll (each
// instruction waits ~11 cycles on the one before, ncu), so that case skips the chunk arithmetic.
// A thread's rows only grow (grid_stride_divided), so the DP group holding them -- its rows
// [first, end) -- is looked up again only when a row passes its end: at most once a group, not
// once an item (the lookup, a select over every member's offset, was ~40 instructions an item).
// Replicated, the rows of my own DP group are not received (I quantized them myself).
template <typename Receive>
__device__ __forceinline__ void for_each_foreign_item(const TokenShape& s, int me, bool replicated, int64_t items,
                                                      Receive receive) {
  if (replicated && s.dp == 1) return;  // one DP group: every row was quantized here
  int d = 0;
  int64_t first = 0, end = 0;  // group d's rows (none yet)
  grid_stride_divided(s.rc.offset[s.dp] * items, items, [&](int64_t o, int64_t k) {
    if (o >= end) {
      d = group_of_row(s, o);
      first = s.rc.offset[d];
      end = s.rc.offset[d + 1];
    }
    const int64_t j = o - first;
    if (s.tp == 1) {  // uniform
      if (d != me) receive(o, k, d, j, j);
      return;
    }
    if (replicated && d == s.d) return;
    const int64_t count = end - first;
    const int t = chunk_owner(j, count, s.tp), owner = d * s.tp + t;
    if (owner != me) receive(o, k, owner, j, j - chunk_begin(count, t, s.tp));
  });
}

// Fingerprint fields the quantized gathers add: the format, the fusion and who sums the
// partial rows (peers must agree on all three; local: lamport_quant_local.cu's algorithm).
template <int F>
__device__ __forceinline__ int quant_fields(bool fused, bool replicated, bool local = false) {
  return F | (fused ? 4 : 0) | (replicated ? 8 : 0) | (local ? 16 : 0);
}

// Dynamic shared memory of both kernels: a fused row, staged (fp32).
inline size_t quant_staging_bytes(int64_t hidden) { return (size_t)hidden * sizeof(float); }

// The threads of a plain row's team in the Lamport kernel, a kernel instance's W: the narrowest
// of kNarrowTeams that holds every lane of the row -- 128 threads, four a full block, for at most
// 128 data lanes (nvfp4 hidden <= 2048, the fp8 formats <= 1024), 256, two a block, for at most
// 256 (nvfp4 <= 4096, fp8 <= 2048) -- where a team of kThreads would leave half or more of its
// threads without a lane; kThreads for wider rows. Every other row, and every row of the LL
// kernel, has a team of kThreads. Why, and why not the LL kernel (on 2x H200 narrow teams made it
// 1.08-1.25x slower at 256-512 tokens, where one shared GPU had shown it faster):
// docs/quantization.md ("Narrow row teams").
constexpr int kNarrowTeams[] = {128, 256};
inline int team_threads(int64_t data_lanes) {
  for (int w : kNarrowTeams)
    if (data_lanes <= w) return w;
  return kThreads;
}

// launch(KL, W) as std::integral_constants: the row team of rows of `data_lanes` lanes in RowMode
// M -- W threads (team_threads for plain rows where Narrow, else kThreads), each holding KL =
// ceil(data_lanes / W) lanes (1 .. kLanesPerThread<F>: the kernels' instances).
template <int F, int M, bool Narrow, typename Launch>
int with_row_team(int64_t data_lanes, Launch launch) {
  using One = std::integral_constant<int, 1>;
  using Full = std::integral_constant<int, kThreads>;
  static_assert(kNarrowTeams[0] == 128 && kNarrowTeams[1] == 256, "an instance per narrow team");
  if constexpr (Narrow && M == kRowsPlain) {  // (no narrow instance of the other rows)
    const int w = team_threads(data_lanes);
    if (w == 128) return launch(One{}, std::integral_constant<int, 128>{});
    if (w == 256) return launch(One{}, std::integral_constant<int, 256>{});
  }
  const int64_t kl = ceil_div(data_lanes, kThreads);
  if (kl <= 1) return launch(One{}, Full{});
  if constexpr (kLanesPerThread<F> >= 2) {
    if (kl == 2) return launch(std::integral_constant<int, 2>{}, Full{});
  }
  if constexpr (kLanesPerThread<F> >= 3) {
    if (kl == 3) return launch(std::integral_constant<int, 3>{}, Full{});
  }
  static_assert(kLanesPerThread<F> <= 3, "an instance per lane count");
  return (int)cudaErrorInvalidValue;
}

// launch(std::integral_constant<int, mode>{}): the kernel instance of a RowMode.
template <typename Launch>
int with_row_mode(int mode, Launch launch) {
  if (mode == kRowsReduced) return launch(std::integral_constant<int, kRowsReduced>{});
  if (mode == kRowsFused) return launch(std::integral_constant<int, kRowsFused>{});
  return launch(std::integral_constant<int, kRowsPlain>{});
}

// launch(KL, W, M, OWN) as std::integral_constants: the kernel instance for rows of `data_lanes`
// lanes in RowMode `mode` (its row team: with_row_team, narrow teams where Narrow: the Lamport
// kernel), in own-count mode or not (own_count.cuh: an instance each, so the given-count
// instances hold none of own-count mode's code; stage_my_rows' first row is some).
template <int F, bool Narrow, typename Launch>
int with_kernel_instance(int64_t data_lanes, int mode, bool own, Launch launch) {
  return with_row_mode(mode, [&](auto m) {
    return with_row_team<F, decltype(m)::value, Narrow>(data_lanes, [&](auto kl, auto w) {
      return own ? launch(kl, w, m, std::true_type{}) : launch(kl, w, m, std::false_type{});
    });
  });
}

// Both launchers' grid: at least one row team per row a rank stages (a team works its rows one
// after another; every row of the DP group when it stages them all, else a 1/tp chunk), and
// enough threads for one wire item (lane or unit) each of the rows it receives -- all but its
// own chunk, where the counts are on the host -- at most one block per SM (blocks_for). Where
// teams may be split (`split`: splits_rows) the smallest of spread_grid's block sizes whose grid
// fits max_blocks, a 512-thread team being kThreads / threads blocks (row_team); else full
// blocks. Narrow teams (team_threads) run in the same grid: what was one team's is kThreads / W
// teams' (a block of 256 threads one or two, a full block two or four). Sized for 256-thread
// teams (fewer blocks a row), the grid of 16-33 tokens had about half the threads, and those calls took
// up to 1.3x the time (run 83 of results/shared_1xH100). What the split saves, measured:
// docs/quantization.md ("Row teams").
inline Grid quant_grid(const RowsArg& io, const GroupArgs& g, int tp, const RowPlan& plan, bool split,
                       int64_t items_per_row) {
  const int dp = g.nranks / tp;
  const int64_t largest = grid_rows(io, dp, RowsSpan::kLargest, io.in_rows);
  const int64_t staged = plan.every_row ? largest : ceil_div(largest, tp);
  int64_t received = grid_rows(io, dp, RowsSpan::kAll, io.out_rows);
  if (!io.sizes.device && !io.sizes.own) {  // my chunk (chunk_begin's cut) is not received
    const int64_t group = io.sizes.host[g.me / tp] > 0 ? io.sizes.host[g.me / tp] : 0, t = g.me % tp;
    const int64_t chunk = group * (t + 1) / tp - group * t / tp;
    received = received > chunk ? received - chunk : 0;
  }
  const int64_t items = received * items_per_row, teams = staged > 1 ? staged : 1;
  for (int threads : kSpreadBlockThreads) {
    if (!split || threads == kThreads) break;
    const int64_t parts = kThreads / threads, by_items = ceil_div(items, threads);
    const int64_t blocks = parts * ceil_div(teams * parts > by_items ? teams * parts : by_items, parts);
    if (blocks <= g.max_blocks) return Grid{(int)blocks, threads};
  }
  const int by_rows = (int)(staged < g.max_blocks ? staged : g.max_blocks);
  const int by_items = blocks_for(items, g);
  return Grid{by_rows > by_items ? by_rows : by_items, kThreads};
}

// The launchers' argument check (both take an algorithm, a hidden size, a tp, for nvfp4 a
// global scale, and in own-count mode where the learned counts go).
inline bool quant_args_valid(const GroupArgs* g, int algorithm, int format, int tp, int64_t hidden,
                             const float* global_scale, const int32_t* sizes_device, const int32_t* own_count) {
  return !(hidden % 16 || hidden <= 0 || hidden > kMaxQuantHidden || tp < 1 || g->nranks % tp ||
           (format == kQuantNvfp4 && !global_scale) || (own_count && !sizes_device) ||
           (algorithm != kQuantGatherOwner && algorithm != kQuantGatherOneHop && algorithm != kQuantGatherLocal));
}

}  // namespace hc

#define HC_DISPATCH_QUANT(FMT, ...)              \
  switch (FMT) {                                 \
    case hc::kQuantFp8: {                        \
      constexpr int Fmt = hc::kQuantFp8;         \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
    case hc::kQuantFp8Block128: {                \
      constexpr int Fmt = hc::kQuantFp8Block128; \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
    case hc::kQuantNvfp4: {                      \
      constexpr int Fmt = hc::kQuantNvfp4;       \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
    default:                                     \
      return (int)cudaErrorInvalidValue;         \
  }
