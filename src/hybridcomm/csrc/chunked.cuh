// The chunked protocol: full-width stores into areas of their own, one release flag per chunk.
//
// For the bandwidth path (pipelined_all_reduce.cu, pipelined_all_gather_v.cu). A sender writes a chunk of its payload
// into a peer's area with plain 16-byte stores (16 bytes of payload each), then, after a
// barrier, one thread per peer fences and stores the call's flag into that peer's flag for
// (phase, me, chunk). The receiver waits for the flags of one chunk from every source, then
// reads it with L1 bypassed. So the receiver of chunk k works while chunk k + 1 is in flight.
//
// Flags only grow (the group's call counter, call.cuh), so waiting is "flag >= this call's
// flag": no reset, no zeroing. A peer at most one call ahead (end_call) may already have
// stored the next call's flag; its data for that call lands in the other slot, and its data
// for this call was released before, so ">=" is still right.
//
// The areas are not shared with any other protocol, so stale data needs no zeroing either:
// the LL/bulk areas could not take it (a stale unit might read as an LL packet carrying a
// later call's flag), the Lamport areas must hold the sentinel.
//
// Region layout, after the Lamport slots (workspace.py `chunked_offset` is the host mirror):
//   [flags: 2 phases x kMaxRanks sources x kMaxChunks][slot 0: A x n, B x n][slot 1: A x n, B x n]
#pragma once

#include "bulk.cuh"
#include "lanes.cuh"
#include "reserved.cuh"
#include "rows.cuh"

namespace hc {

__device__ __forceinline__ char* chunked_section(const CallCtx& cx, char* region) {
  return region + kFlagBytes + (uint64_t)(2 * 2 + kLamportSlots) * cx.g.nranks * cx.g.area_bytes;
}

// Source `src`'s flag for `chunk` of `phase` in the owner of `region`.
__device__ __forceinline__ uint32_t* chunk_flag(const CallCtx& cx, char* region, int phase, int src, int64_t chunk) {
  return (uint32_t*)chunked_section(cx, region) + ((int64_t)phase * kMaxRanks + src) * kMaxChunks + chunk;
}

// The area where `src` puts its chunks of `phase` for the owner of `region` (this call's slot).
__device__ __forceinline__ uint4* chunked_area(const CallCtx& cx, char* region, int phase, int src) {
  const uint64_t index = ((uint64_t)cx.slot * 2 + phase) * cx.g.nranks + src;
  return (uint4*)(chunked_section(cx, region) + kChunkFlagBytes + index * cx.g.area_bytes);
}

// This block's stores of `chunk` of `phase` to every peer are done: release them, unless a
// thread of the block aborted (signal_block).
__device__ __forceinline__ void release_chunk(const CallCtx& cx, int phase, int64_t chunk) {
  const GroupArgs& g = cx.g;
  if (cx.block_aborted()) return;  // (a barrier: the block's stores happen before the fence in release_flag)
  if (threadIdx.x < g.nranks && threadIdx.x != g.me)
    release_flag(chunk_flag(cx, g.regions[threadIdx.x], phase, g.me, chunk), cx.flag);
}

// Waits until every peer s with wants(s) has released `chunk` of `phase` into my region (one
// thread polls each source, so the wait costs one latency, not one per source).
template <typename Wants>
__device__ __forceinline__ void wait_chunk(const CallCtx& cx, int phase, int64_t chunk, Wants wants) {
  const GroupArgs& g = cx.g;
  if (threadIdx.x < g.nranks && threadIdx.x != g.me && wants((int)threadIdx.x))
    wait_flag(cx, chunk_flag(cx, g.regions[g.me], phase, threadIdx.x, chunk), threadIdx.x);
  __syncthreads();
}

__device__ __forceinline__ void wait_chunk(const CallCtx& cx, int phase, int64_t chunk) {
  wait_chunk(cx, phase, chunk, [](int) { return true; });
}

// Copies units [0, len) of src to dst, this block's threads striding, kBatch loads in flight per
// thread before their stores (remote stores are posted; the loads are what must overlap).
// `load` reads one unit (a plain load of a local input, or __ldcg of an area a peer wrote).
template <typename Load>
__device__ __forceinline__ void copy_units(uint4* dst, int64_t len, Load load) {
  constexpr int kBatch = 4;
  for (int64_t base = threadIdx.x; base < len; base += kBatch * (int64_t)blockDim.x) {
    uint4 v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t u = base + k * (int64_t)blockDim.x;
      if (u < len) v[k] = load(u);
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t u = base + k * (int64_t)blockDim.x;
      if (u < len) dst[u] = v[k];
    }
  }
}

// -- the pipeline's schedule: chunk c of every part belongs to block c % gridDim.x ----------

// How many of `chunks` chunks this block handles.
__device__ __forceinline__ int64_t block_chunks(int64_t chunks) {
  return blockIdx.x < chunks ? (chunks - 1 - blockIdx.x) / gridDim.x + 1 : 0;
}

// This block's i-th chunk.
__device__ __forceinline__ int64_t nth_chunk(int64_t i) { return (int64_t)blockIdx.x + i * gridDim.x; }

// A row op on the chunked protocol: its counts, checked against the area (every rank reaches
// the same verdict) and against my buffers (rows.cuh), and their cut into chunks.
struct ChunkedRows {
  RowCounts rc;
  int64_t row_units, in_units, out_units, chunk, chunks;  // chunks: of the largest member's rows

  // Units of chunk c of member j's rows (0 past their end).
  __device__ __forceinline__ int64_t piece(int j, int64_t c) const {
    const int64_t left = rc.count(j) * row_units - c * chunk;
    return left <= 0 ? 0 : left < chunk ? left : chunk;
  }
};

// gather: a rank reads its own rows and writes everyone's (all_gather_v); else it reads
// everyone's and writes its own (reduce_scatter_v).
__device__ __forceinline__ ChunkedRows chunked_rows(const CallCtx& cx, const RowsArg& io, int64_t chunk, bool gather) {
  const int n = cx.g.nranks, me = cx.g.me;
  const int64_t row_units = io.row_lanes / 2;
  const RowCounts rc = load_counts_within(cx, io.sizes, n, row_units * kChunkedUnitBytes, kChunkedWireFactor,
                                          cx.g.area_bytes);
  const int64_t mine = rc.count(me), all = rc.offset[n];
  check_buffers(cx, (gather ? mine : all) > io.in_rows || (gather ? all : mine) > io.out_rows);
  return ChunkedRows{rc, row_units, io.in_rows * row_units, io.out_rows * row_units, chunk,
                     (rc.max * row_units + chunk - 1) / chunk};
}

// A pipelined row op's prologue after begin_call: its counts (chunked_rows), then arrive() with
// the call's fingerprint (the chunk size in its variant field).
template <typename T>
__device__ __forceinline__ ChunkedRows arrive_chunked_rows(const CallCtx& cx, int op, const RowsArg& io,
                                                           int64_t chunk, bool gather, int variant) {
  const ChunkedRows r = chunked_rows(cx, io, chunk, gather);
  arrive(cx, make_fingerprint(op, Lane<T>::kDType, kChunkedOneShot, variant, r.rc.hash,
                              (uint64_t)r.row_units * kChunkedUnitBytes));
  return r;
}

// The group size as a compile-time constant where a kernel is built for one (kRanks: 2, 4), so
// a reduce keeps kReduceBatch units' loads of every source in registers; 0: any size up to
// kMaxRanks, one unit at a time (8 sources x 2 units would spill at kThreads threads).
template <int kRanks>
struct Geometry {
  static constexpr int kSources = kRanks ? kRanks : kMaxRanks;  // entries of the per-source arrays
  static constexpr int kReduceBatch = kRanks ? 2 : 1;
  __device__ __forceinline__ static int members(const GroupArgs& g) { return kRanks ? kRanks : g.nranks; }
};

// Units [first, first + len) of `phase` summed over the group's sources in group order, in fp32
// (sum_units): mine from local(u), every other source's from its area in my region (past L1);
// put(u, sum) takes each. u counts from `first`. All loads of a thread's kReduceBatch units
// are in flight before its first sum.
template <typename T, int kRanks, typename Local, typename Put>
__device__ __forceinline__ void reduce_units(const CallCtx& cx, int phase, int64_t first, int64_t len, Local local,
                                             Put put) {
  using G = Geometry<kRanks>;
  const GroupArgs& g = cx.g;
  const int n = G::members(g), me = g.me;
  const uint4* from[G::kSources];  // where each source's part of this chunk landed
#pragma unroll
  for (int s = 0; s < G::kSources; ++s) from[s] = s < n ? chunked_area(cx, g.regions[me], phase, s) + first : nullptr;
  for (int64_t base = threadIdx.x; base < len; base += G::kReduceBatch * (int64_t)blockDim.x) {
    uint4 v[G::kReduceBatch][G::kSources];
#pragma unroll
    for (int k = 0; k < G::kReduceBatch; ++k) {
      const int64_t u = base + k * (int64_t)blockDim.x;
#pragma unroll
      for (int s = 0; s < G::kSources; ++s) {
        if (s < n && u < len) v[k][s] = s == me ? local(u) : __ldcg(from[s] + u);
      }
    }
#pragma unroll
    for (int k = 0; k < G::kReduceBatch; ++k) {
      const int64_t u = base + k * (int64_t)blockDim.x;
      if (u >= len) break;
      put(u, sum_units<T>(v[k], n));
    }
  }
}

// -- host side of the launchers --------------------------------------------------------------

// The fingerprint's variant field: log2(chunk_bytes / kMinChunkBytes), or -1 for a chunk size
// the launchers do not take (a power of two in [kMinChunkBytes, kMaxChunkBytes]).
inline int chunk_variant(int64_t chunk_bytes) {
  int v = 0;
  for (int64_t b = kMinChunkBytes; b <= kMaxChunkBytes; b *= 2, ++v)
    if (b == chunk_bytes) return v;
  return -1;
}

// Units per chunk for a source part of `longest` units: chunk_bytes, doubled (the same on every
// rank) until the part needs at most kMaxChunks chunks (flags).
inline int64_t chunk_units(int64_t longest, int64_t chunk_bytes) {
  int64_t chunk = chunk_bytes / kChunkedUnitBytes;
  while ((longest + chunk - 1) / chunk > kMaxChunks) chunk *= 2;
  return chunk;
}

// Blocks to launch: the caller's, at most one per chunk and one per SM (all must be resident).
inline int pipeline_blocks(int64_t chunks, int blocks, const GroupArgs& g) {
  int64_t b = blocks;
  if (b > chunks) b = chunks;
  if (b > g.max_blocks) b = g.max_blocks;
  return b < 1 ? 1 : (int)b;
}

// A row op's chunk and block count. The chunk follows from the area (the most one member's part
// may be), not from the counts, so every rank cuts the same chunks even when the counts live
// in device memory; blocks cover the chunks of `most_units` (what the buffers allow a part).
struct RowsLaunch {
  int64_t chunk;
  int blocks;
};

inline RowsLaunch rows_launch(const GroupArgs& g, int64_t most_units, int64_t chunk_bytes, int blocks) {
  const int64_t area_units = (int64_t)(g.area_bytes / kChunkedUnitBytes), chunk = chunk_units(area_units, chunk_bytes);
  const int64_t part = most_units < area_units ? most_units : area_units;
  return RowsLaunch{chunk, pipeline_blocks((part + chunk - 1) / chunk, blocks, g)};
}

}  // namespace hc
