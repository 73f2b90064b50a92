// Row counts, their checks against buffers and areas, and how rows are cut into chunks.
#pragma once

#include "call.cuh"

namespace hc {

// A row kernel's geometry: rows per member, 8-byte lanes per row, and the rows each of its
// buffers holds (its capacity: every access beyond it is skipped).
struct RowsArg {
  SizesArg sizes;
  int64_t row_lanes, in_rows, out_rows;

  __device__ __forceinline__ int64_t in_lanes() const { return in_rows * row_lanes; }
  __device__ __forceinline__ int64_t out_lanes() const { return out_rows * row_lanes; }
};

// Row counts and offsets of up to kMaxRanks members.
struct RowCounts {
  int64_t count[kMaxRanks];
  int64_t offset[kMaxRanks + 1];
  int64_t max;
  uint32_t hash;  // of the counts as read (for the call fingerprint)
};

// Offsets and largest count of r.count[0 .. n-1].
__device__ __forceinline__ void count_offsets(RowCounts& r, int n) {
  r.offset[0] = 0;
  r.max = 0;
#pragma unroll
  for (int i = 0; i < kMaxRanks; ++i) {
    const int64_t c = i < n ? r.count[i] : 0;
    r.offset[i + 1] = r.offset[i] + c;
    r.max = c > r.max ? c : r.max;
  }
}

__device__ __forceinline__ RowCounts load_counts(const SizesArg& s, int n) {
  RowCounts r;
  uint32_t hash = 2166136261u;  // FNV-1a over the counts
#pragma unroll
  for (int i = 0; i < kMaxRanks; ++i) {
    int64_t c = 0;
    if (i < n) c = s.device ? (int64_t)max(s.device[i], 0) : (int64_t)s.host[i];
    r.count[i] = c;
    if (i < n) hash = (hash ^ (uint32_t)c) * 16777619u;
  }
  count_offsets(r, n);
  r.hash = hash ^ (hash >> 16);
  return r;
}

// Row counts, checked against an area of `area_bytes` that holds payload at `wire_factor` area
// bytes per byte (rows of row_bytes). Every rank reaches the same verdict (same sizes, same
// area size), so on overflow nobody sends and nobody waits: the counts become zero and the
// error is recorded for the host (CapacityExceeded).
__device__ __forceinline__ RowCounts load_counts_within(const CallCtx& cx, const SizesArg& s, int n, int64_t row_bytes,
                                                        int wire_factor, uint64_t area_bytes) {
  RowCounts rc = load_counts(s, n);
  if (!fits_area(rc.max * row_bytes, wire_factor, area_bytes)) {
    if (grid_thread() == 0) cx.fail(kCapacity, cx.g.me);
    const uint32_t hash = rc.hash;
    rc = RowCounts{};
    rc.hash = hash;
  }
  return rc;
}

// The same for LL rows of row_lanes lanes in the LL/bulk areas.
__device__ __forceinline__ RowCounts load_counts_checked(const CallCtx& cx, const SizesArg& s, int n,
                                                         int64_t row_lanes) {
  return load_counts_within(cx, s, n, row_lanes * kLLUnitBytes, kLLWireFactor, cx.g.area_bytes);
}

// Counts beyond this rank's own buffers: every access is guarded, so record and carry on
// (the peers still get their packets and nobody waits forever).
__device__ __forceinline__ void check_buffers(const CallCtx& cx, bool overflow) {
  if (overflow && grid_thread() == 0) cx.fail(kCapacity, cx.g.me);
}

// Row counts of a group collective, checked against the area and my buffers: a gather reads my
// rows and writes everyone's; a reduce-scatter reads everyone's and writes mine.
__device__ __forceinline__ RowCounts group_counts(const CallCtx& cx, const RowsArg& io, bool gather) {
  const int n = cx.g.nranks, me = cx.g.me;
  const RowCounts rc = load_counts_checked(cx, io.sizes, n, io.row_lanes);
  const int64_t mine = rc.count[me], all = rc.offset[n];
  check_buffers(cx, (gather ? mine : all) > io.in_rows || (gather ? all : mine) > io.out_rows);
  return rc;
}

// Rows [begin, end) of `rows` owned by part p of `parts` (the cut of arguments.split_evenly).
__device__ __forceinline__ int64_t chunk_begin(int64_t rows, int p, int parts) { return rows * p / parts; }

// Which part owns row r (< rows) of `rows` cut into `parts`: the largest p with
// chunk_begin(rows, p, parts) <= r, i.e. p * rows < (r + 1) * parts.
__device__ __forceinline__ int chunk_owner(int64_t r, int64_t rows, int parts) {
  return (int)(((r + 1) * parts - 1) / rows);
}

// The token transitions' view of the world group: ranks numbered rank = d * tp + t (DP group
// d, attention-TP rank t), DP group d holding rc.count[d] rows of row_lanes lanes.
struct TokenShape {
  int tp, dp, d, t;  // attention TP size, DP size, and my coordinates
  RowCounts rc;      // rows per DP group
  int64_t row_lanes;

  // My DP group's members (my attention-TP group).
  __device__ __forceinline__ Members tp_group() const { return Members{d * tp, tp, t}; }
  // The fingerprint's variant field: attn_tp and whether rows are partial.
  __device__ __forceinline__ int variant(int partial) const { return (tp - 1) | (partial ? 8 : 0); }
};

__device__ __forceinline__ TokenShape token_shape(const CallCtx& cx, int tp, const SizesArg& sizes,
                                                  int64_t row_lanes) {
  const GroupArgs& g = cx.g;
  return TokenShape{tp, g.nranks / tp, g.me / tp, g.me % tp, load_counts_checked(cx, sizes, g.nranks / tp, row_lanes),
                    row_lanes};
}

// DP group of output lane o (lanes of all groups back to back).
__device__ __forceinline__ int group_of_lane(const TokenShape& s, int64_t o) {
  int d = 0;
  while (d + 1 < s.dp && s.rc.offset[d + 1] * s.row_lanes <= o) ++d;
  return d;
}

// Rank holding chunk lane i of group d after a chunked phase.
__device__ __forceinline__ int chunk_holder(const TokenShape& s, int d, int64_t i) {
  return d * s.tp + chunk_owner(i / s.row_lanes, s.rc.count[d], s.tp);
}

}  // namespace hc
