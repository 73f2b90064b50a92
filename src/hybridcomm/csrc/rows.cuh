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

// N values kept in registers though read at run-time indices (my member, my DP group): a
// plainly indexed array would live in local memory (ptxas: a 152-176 byte stack frame in every
// row kernel), whose stores and dependent loads the row kernels paid before arrive() (trace
// build, 2x H200: their prologue took 2-3 us, all_reduce's 0.6 us). operator[] selects over
// all N (a constant index folds to one register); entries are written through v[] with
// constant indices only (unrolled loops).
template <int N>
struct Registers {
  int64_t v[N];

  __device__ __forceinline__ int64_t operator[](int i) const {
    int64_t r = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) r = k == i ? v[k] : r;
    return r;
  }
};

// Row counts of up to kMaxRanks members, as offsets: member i's rows are [offset[i],
// offset[i + 1]) (a count array beside them cost 16 registers, and spills in the tightest kernels).
struct RowCounts {
  Registers<kMaxRanks + 1> offset;  // entries past the members' hold the total
  int64_t max;
  uint32_t hash;  // of the counts as read (for the call fingerprint)

  __device__ __forceinline__ int64_t count(int i) const { return offset[i + 1] - offset[i]; }

  // Which of the first n members holds unit o of the rows back to back, `width` units a row:
  // the last one starting at or before o (members of no rows are passed over). Unrolled, so
  // that the offsets stay in registers.
  __device__ __forceinline__ int holder(int64_t o, int n, int64_t width) const {
    int m = 0;
#pragma unroll
    for (int k = 1; k < kMaxRanks; ++k) m = k < n && offset.v[k] * width <= o ? k : m;
    return m;
  }
};

// Offsets and largest count of count[0 .. n-1].
__device__ __forceinline__ void count_offsets(RowCounts& r, const int64_t (&count)[kMaxRanks], int n) {
  r.offset.v[0] = 0;
  r.max = 0;
#pragma unroll
  for (int i = 0; i < kMaxRanks; ++i) {
    const int64_t c = i < n ? count[i] : 0;
    r.offset.v[i + 1] = r.offset.v[i] + c;
    r.max = c > r.max ? c : r.max;
  }
}

// Device counts: every load issued before any is used (a branch per entry made them one
// memory round trip each, one after the other).
__device__ __forceinline__ RowCounts load_counts(const SizesArg& s, int n) {
  int32_t given[kMaxRanks];
  if (s.device) {
#pragma unroll
    for (int i = 0; i < kMaxRanks; ++i) given[i] = i < n ? s.device[i] : 0;
  } else {
#pragma unroll
    for (int i = 0; i < kMaxRanks; ++i) given[i] = i < n ? s.host[i] : 0;
  }
  RowCounts r;
  int64_t count[kMaxRanks];
  uint32_t hash = 2166136261u;  // FNV-1a over the counts
#pragma unroll
  for (int i = 0; i < kMaxRanks; ++i) {
    count[i] = max(given[i], 0);  // (host counts are never negative: clamping them is free)
    if (i < n) hash = (hash ^ (uint32_t)count[i]) * 16777619u;
  }
  count_offsets(r, count, n);
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
  const int64_t mine = rc.count(me), all = rc.offset[n];
  check_buffers(cx, (gather ? mine : all) > io.in_rows || (gather ? all : mine) > io.out_rows);
  return rc;
}

// A thread's first element of `in` (index grid_thread(); zero at `size` and beyond), loaded as
// soon as the kernel may read its input, before the counts and arrive(): the load then overlaps
// the call flag's and the counts' loads instead of following the arrival packet (as
// all_reduce's one-shot does). at(j): element j, zero at `size` and beyond.
template <typename V>
struct EarlyInput {
  const V* __restrict__ in;
  int64_t size, first_index;
  V first;

  __device__ __forceinline__ V at(int64_t j) const { return j == first_index ? first : j < size ? in[j] : V{}; }
};

template <typename V>
__device__ __forceinline__ EarlyInput<V> early_input(const V* __restrict__ in, int64_t size) {
  const int64_t i = grid_thread();
  return EarlyInput<V>{in, size, i, i < size ? in[i] : V{}};
}

// The same for a reduce-scatter, which sends member s's rows to member s: a thread's element
// i0 = grid_thread() of every member's rows (rows of `width` elements back to back in `in`,
// zero at `size` and beyond), loaded right after the counts, before anything uses the call's
// slot (else the compiler computes the outbox address first and the loads wait for the flag).
// In registers (unrolled), read by selection. at(s, i): element i of member s's rows.
template <typename V>
struct EarlyRows {
  const V* __restrict__ in;
  const RowCounts& rc;
  int64_t size, width, first_index;
  V first[kMaxRanks];

  __device__ __forceinline__ V load(int s, int64_t i) const {
    const int64_t j = rc.offset[s] * width + i;
    return j < size ? in[j] : V{};
  }
  __device__ __forceinline__ V at(int s, int64_t i) const {
    if (i != first_index) return load(s, i);
    V v = first[0];
#pragma unroll
    for (int k = 1; k < kMaxRanks; ++k) v = k == s ? first[k] : v;
    return v;
  }
};

template <typename V>
__device__ __forceinline__ EarlyRows<V> early_rows(const V* __restrict__ in, int64_t size, const RowCounts& rc,
                                                   int n, int64_t width) {
  EarlyRows<V> r{in, rc, size, width, grid_thread(), {}};
#pragma unroll
  for (int s = 0; s < kMaxRanks; ++s) r.first[s] = s < n ? r.load(s, r.first_index) : V{};
  return r;
}

// Rows [begin, end) of `rows` owned by part p of `parts` (the cut of arguments.split_evenly).
__device__ __forceinline__ int64_t chunk_begin(int64_t rows, int p, int parts) { return quot(rows * p, parts); }

// Which part owns row r (< rows) of `rows` cut into `parts`: the largest p with
// chunk_begin(rows, p, parts) <= r, i.e. p * rows < (r + 1) * parts.
__device__ __forceinline__ int chunk_owner(int64_t r, int64_t rows, int parts) {
  return (int)quot((r + 1) * parts - 1, rows);
}

// The token transitions' view of the world group: ranks numbered rank = d * tp + t (DP group
// d, attention-TP rank t), DP group d holding rc.count(d) rows of row_lanes lanes.
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
__device__ __forceinline__ int group_of_lane(const TokenShape& s, int64_t o) { return s.rc.holder(o, s.dp, s.row_lanes); }

// Rank holding chunk lane i of group d after a chunked phase.
__device__ __forceinline__ int chunk_holder(const TokenShape& s, int d, int64_t i) {
  return d * s.tp + chunk_owner(quot(i, s.row_lanes), s.rc.count(d), s.tp);
}

}  // namespace hc
