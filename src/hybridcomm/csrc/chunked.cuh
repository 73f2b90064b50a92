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
#include "reserved.cuh"

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

// This block's stores of `chunk` of `phase` to every peer are done: release them.
__device__ __forceinline__ void release_chunk(const CallCtx& cx, int phase, int64_t chunk) {
  const GroupArgs& g = cx.g;
  __syncthreads();  // the block's stores happen before the fence in release_flag
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

}  // namespace hc
