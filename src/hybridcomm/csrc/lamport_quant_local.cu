// gather_tokens with quantized rows, quantized where they land (algorithm quant_local): the
// unquantized one-shot Lamport gather (lamport_tokens.cu), each rank quantizing every row it
// has summed. Partial rows only (attn_tp >= 2), fused ones with one DP group (the residual of a
// row is on its own group's ranks); the launcher's caller runs the LL kernel's paths otherwise.
//
// Where it wins: at a few tokens a call's time is latency, not bytes, and the quantized
// gathers' other algorithms take two hops (owner) or stage a row's partial lanes on LL and
// quantize in a larger kernel (one hop); this is the bf16 gather's single hop plus the row's
// quantization. The wire carries the partial rows unquantized, so it moves more bytes than the
// owner algorithms from the middle sizes up: the table decides.
//
// Bits: every rank sums a row's tp partial units in tp order in fp32 and rounds once to T, as
// the reference's unquantized gather does (fused: as gather_tokens.cu's gather_fused does), then
// applies quant.cuh's quantizer, the reference quantizer's operations; so every rank writes the
// same bytes, the reference's.
//
//   send:    my partial units to every peer (16 data bytes a store, lamport_tokens.cu's order),
//            from registers loaded before the arrival (EarlyUnits);
//   receive: a thread works whole 16-byte units (UnitQuant). Block formats: a unit a thread over
//            the grid, as the unquantized gather's receive loop. fp8 (one scale a row) and fused
//            rows: a block a row, KU units a thread (the row's max, the norm's sum).
#include "fused_row.cuh"
#include "lamport.cuh"
#include "lamport_quant_local.h"
#include "own_count.cuh"
#include "quant_rows.cuh"

namespace hc {

// A thread works whole 16-byte input units of a row (unit threadIdx.x + k * kThreads, k < KU), as
// the unquantized gather moves them, and quantizes their values itself: fp8 takes one block max
// per row; a format's blocks (fp8_block128: 128 values, nvfp4: 16) span kGroup consecutive
// units, i.e. consecutive lanes of a warp, whose max is a shuffle. (quant_rows.cuh's lanes are 8
// bytes of output, 16 values of nvfp4: half the threads of a 4096-wide row would work there.)
template <typename T, int F>
struct UnitQuant {
  static constexpr int kValues = kLamportUnitBytes / (int)sizeof(T);  // values per input unit
  static constexpr int kBlock = QuantTraits<F>::kBlock;                // values per scale (0: the row)
  static constexpr int kGroup = kBlock ? kBlock / kValues : 0;         // units per scale
  static constexpr int kCodeBytes = F == kQuantNvfp4 ? kValues / 2 : kValues;
  static_assert(kBlock == 0 || (kGroup >= 1 && kGroup <= 32), "a block's units are lanes of one warp");
};

// Unit i of DP group od's rows summed over its tp ranks in tp order (my own partial unit, when
// od is my group, from my input: the register it was sent from where this thread sent it), fp32,
// rounded once to T; into v[0 .. kValues).
template <typename T, int KU>
__device__ __forceinline__ void summed_unit(const LamportCall& lc, int tp, int od, int64_t i,
                                            const EarlyUnits<KU>& in, float* v) {
  const int me = lc.cx.g.me, d = me / tp, t = me % tp;
  uint4 data[kMaxRanks];
  receive_group_units(lc, tp, od, d, t, i, [&] { return fix_reserved<T>(in.at(i)); }, data);
  const uint4 sum = sum_units<T>(data, tp);
  float lo[4], hi[4];
  Lane<T>::unpack(make_uint2(sum.x, sum.y), lo);
  Lane<T>::unpack(make_uint2(sum.z, sum.w), hi);
  constexpr int kN = Lane<T>::kN;
#pragma unroll
  for (int e = 0; e < kN; ++e) {
    v[e] = lo[e];
    v[kN + e] = hi[e];
  }
}

// My unit u of a row (of `units`) summed (summed_unit; row j of DP group od), or zeros past the row.
template <typename T, int KU>
__device__ __forceinline__ void my_unit(const LamportCall& lc, int tp, int od, int64_t j, int64_t u, int64_t units,
                                        const EarlyUnits<KU>& in, float (&v)[UnitQuant<T, kQuantFp8>::kValues]) {
  if (u < units) return summed_unit<T, KU>(lc, tp, od, j * units + u, in, v);
#pragma unroll
  for (int e = 0; e < UnitQuant<T, kQuantFp8>::kValues; ++e) v[e] = 0.f;
}

template <int N>
__device__ __forceinline__ float max_abs(const float (&v)[N]) {
  float a = 0.f;
#pragma unroll
  for (int e = 0; e < N; ++e) a = fmaxf(a, fabsf(v[e]));
  return a;
}

// The codes of one unit's values (multiplier inv) into unit u of a row's data bytes.
template <typename T, int F>
__device__ __forceinline__ void store_codes(const float (&v)[UnitQuant<T, F>::kValues], float inv, uint8_t* data,
                                            int64_t u) {
  using Q = UnitQuant<T, F>;
  if constexpr (F == kQuantNvfp4) {
    const uint32_t codes = nvfp4_codes<Q::kValues>(v, inv);
    if constexpr (Q::kCodeBytes == 4) reinterpret_cast<uint32_t*>(data)[u] = codes;
    else reinterpret_cast<uint16_t*>(data)[u] = (uint16_t)codes;
  } else {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < Q::kValues; e += 2) w[e / 4] |= fp8_codes(v[e], v[e + 1], inv) << (8 * (e % 4));
    if constexpr (Q::kCodeBytes == 8) reinterpret_cast<uint2*>(data)[u] = make_uint2(w[0], w[1]);
    else reinterpret_cast<uint32_t*>(data)[u] = w[0];
  }
}

// Unit u of the block formats (a scale per kGroup units; amax: its block's max): its codes into
// data and, from the block's first unit, the block's scale into scales (both indexed from the
// same base: a row's, or the whole output's, which is contiguous over rows).
template <typename T, int F>
__device__ __forceinline__ void store_block_unit(const float (&v)[UnitQuant<T, F>::kValues], float amax,
                                                 float global_scale, uint8_t* data, uint8_t* scales, int64_t u) {
  constexpr int kGroup = UnitQuant<T, F>::kGroup;
  if constexpr (F == kQuantNvfp4) {
    const Nvfp4Scale sc = nvfp4_scale(amax, global_scale);
    store_codes<T, F>(v, sc.inv, data, u);
    if (u % kGroup == 0) scales[u / kGroup] = sc.sf;
  } else {
    const Fp8Scale sc = fp8_scale(amax);
    store_codes<T, F>(v, sc.inv, data, u);
    if (u % kGroup == 0) reinterpret_cast<float*>(scales)[u / kGroup] = sc.scale;
  }
}

// An fp8 row's end, every thread of the block: the token's scale from the block max of the
// threads' maxima `a` and my units' codes -- their values from `v` (one unit a thread, still in
// registers) or, kStaged, from my elements of `row`. Where they go is the caller's:
// store_scale(scale) (called by thread 0) and data() (the row's data bytes); nothing is stored
// for a row past the output (o >= out_rows), but the block max is still taken. (Callables, not
// pointers: each caller's address arithmetic stays where it wrote it, after the block max, and
// the machine code is what each made when it wrote this out itself -- scripts/sass_compare.py.)
template <typename T, int KU, bool kStaged, typename StoreScale, typename Data>
__device__ __forceinline__ void store_fp8_row(float a, float (&v)[UnitQuant<T, kQuantFp8>::kValues], const float* row,
                                              int64_t units, int64_t o, int64_t out_rows, float* warp_buf,
                                              const StoreScale& store_scale, const Data& data) {
  constexpr int kV = UnitQuant<T, kQuantFp8>::kValues;
  const Fp8Scale token = fp8_scale(block_max(a, warp_buf));
  if (o >= out_rows) return;
  if (threadIdx.x == 0) store_scale(token.scale);
  uint8_t* bytes = data();
#pragma unroll 1
  for (int k = 0; k < KU; ++k) {
    const int64_t u = my_lane<kThreads>(k);
    if (u >= units) break;
    if (kStaged) for (int e = 0; e < kV; ++e) v[e] = row[u * kV + e];
    store_codes<T, kQuantFp8>(v, token.inv, bytes, u);
  }
}

// fp8 (one scale per row): output row o (row j of DP group od) summed and quantized into out;
// every thread of the block calls this (the block max). Units are waited for one at a time, in
// a loop that is not unrolled (one copy of the wait's code, as quant_rows.cuh's row_values);
// with several units a thread their values wait for the row's max in `row` (fp32, the thread's
// own: no barrier).
template <typename T, int KU>
__device__ __forceinline__ void quantize_fp8_row(const LamportCall& lc, int tp, int od, int64_t j, int64_t o,
                                                 const EarlyUnits<KU>& in, int64_t units, float* row,
                                                 float* warp_buf, const QuantOut& out) {
  constexpr int kV = UnitQuant<T, kQuantFp8>::kValues;
  float v[kV], a = 0.f;
#pragma unroll 1
  for (int k = 0; k < KU; ++k) {
    const int64_t u = my_lane<kThreads>(k);
    my_unit<T, KU>(lc, tp, od, j, u, units, in, v);
    a = fmaxf(a, max_abs(v));
    if (KU > 1 && u < units) for (int e = 0; e < kV; ++e) row[u * kV + e] = v[e];
  }
  store_fp8_row<T, KU, (KU > 1)>(
      a, v, row, units, o, out.out_rows, warp_buf,
      [&](float scale) { reinterpret_cast<float*>(out.scales)[o] = scale; },
      [&] { return reinterpret_cast<uint8_t*>(out.data) + o * out.data_lanes * 8; });
}

// The first word of a unit another block of this kernel writes with this call's flag as its second
// word and the sentinel word as its third, once it carries both. (No unit of data has a sentinel
// word, reserved.cuh: so rows that lamport_fused_tokens.cu keeps in the same area, whatever their
// bits, are never taken for a tag.) Bounded like every wait: it stops when the group has aborted
// or the call's deadline passed (the block being waited for is then itself stuck on a peer, and
// records that peer's timeout); it records nothing itself.
__device__ __forceinline__ uint32_t wait_tagged_word(const CallCtx& cx, const uint4* p) {
  int spins = 0;
  for (;;) {
    const uint4 v = load_unit_volatile(p);
    if (v.y == cx.flag && v.z == kSentinelWord) return v.x;
    if ((++spins & (kPollsPerCheck - 1)) == 0 &&
        (*(volatile uint32_t*)&cx.g.state[kAborted] || global_timer_ns() >= cx.deadline)) {
      cx.aborted = true;
      return 0u;
    }
  }
}

// fp8 rows split over blocks (a call of few rows wider than a block): block x works part
// x % parts of output row x / parts, a unit a thread, as the block formats do; the row's max is
// every part's block max. Each part publishes its max, tagged with the call's flag, in a 16-byte
// unit of my own Lamport area of this slot (the area "from me", which the protocol never uses:
// peers write only their own areas, the re-fill skips mine); every part of the row reads them
// all (tagged with the flag, so no re-fill and no reset: an older call's value carries an older
// flag; wait_tagged_word says why the fused gather's rows kept there are no tags either). The
// launcher splits only when every part has a block of its own, all resident at once, so a part
// never waits for a block that has not started. A row's max is exact whatever the order, so the
// bits are the unsplit row's.
template <typename T, int KU>
__device__ __forceinline__ void quantize_fp8_part(const LamportCall& lc, int tp, int od, int64_t j, int64_t o,
                                                  int part, int parts, const EarlyUnits<KU>& in, int64_t units,
                                                  float* warp_buf, const QuantOut& out) {
  constexpr int kV = UnitQuant<T, kQuantFp8>::kValues;
  const int64_t u = (int64_t)part * blockDim.x + threadIdx.x;
  float v[kV];
  my_unit<T, KU>(lc, tp, od, j, u, units, in, v);
  const float part_max = block_max(max_abs(v), warp_buf);
  uint4* maxima = lc.inbox(lc.cx.g.me) + o * parts;
  if (threadIdx.x == 0)  // (even after a give-up: the row's other parts wait for it)
    store_unit_volatile(maxima + part, make_uint4(__float_as_uint(part_max), lc.cx.flag, kSentinelWord, 0u));
  float a = 0.f;
  if (threadIdx.x < parts) a = __uint_as_float(wait_tagged_word(lc.cx, maxima + threadIdx.x));
  const Fp8Scale token = fp8_scale(block_max(a, warp_buf));
  if (o >= out.out_rows) return;
  if (part == 0 && threadIdx.x == 0) reinterpret_cast<float*>(out.scales)[o] = token.scale;
  uint8_t* data = reinterpret_cast<uint8_t*>(out.data) + o * out.data_lanes * 8;
  if (u < units) store_codes<T, kQuantFp8>(v, token.inv, data, u);
}

// The block formats (a scale per kGroup units): every output unit summed and quantized, the
// grid's threads one unit each in turn as the unquantized gather's receive loop (a block's
// units are lanes of one warp: every lane of a warp takes part in each round, so the round
// bound is the warp's). Data and scales are contiguous over rows (a row holds whole blocks), so
// output unit o's codes are unit o of the data and its block's scale is scale o / kGroup.
template <typename T, int F, int KU>
__device__ __forceinline__ void quantize_block_units(const LamportCall& lc, int tp, const RowCounts& rc, int dp,
                                                     const EarlyUnits<KU>& in, int64_t row_units,
                                                     float global_scale, const QuantOut& out) {
  using Q = UnitQuant<T, F>;
  const int64_t total = rc.offset[dp] * row_units, out_units = out.out_rows * row_units;
  const int lane = threadIdx.x & 31;
  for (int64_t first = grid_thread() - lane; first < total; first += grid_threads()) {
    const int64_t o = first + lane;
    float v[Q::kValues];
    if (o < total) {
      const int od = rc.holder(o, dp, row_units);
      summed_unit<T, KU>(lc, tp, od, o - rc.offset[od] * row_units, in, v);
    } else {
      for (int e = 0; e < Q::kValues; ++e) v[e] = 0.f;
    }
    const float amax = group_max(max_abs(v), Q::kGroup);
    if (o >= total || o >= out_units) continue;
    store_block_unit<T, F>(v, amax, global_scale, reinterpret_cast<uint8_t*>(out.data), out.scales, o);
  }
}

// Fused (residual add + RMSNorm; one DP group, so every row is this rank's group's and its
// residual is here): row r summed over tp with the residual added (residual_out), staged and
// normalised by fused_row.cuh, then quantized. So the normed rows are our unquantized fused
// gathers' (gather_tokens.cu's gather_fused, lamport_fused_tokens.cu), bit for bit, as the other
// quantized kernels' (docs/quantization.md). Every thread of the block calls this.
template <typename T, int F, int KU>
__device__ __forceinline__ void quantize_fused_row(const LamportCall& lc, int tp, int64_t r, const EarlyUnits<KU>& in,
                                                   const Fusion& fu, int64_t units, int64_t in_rows,
                                                   float global_scale, float* row, float* warp_buf,
                                                   const QuantOut& out) {
  using Q = UnitQuant<T, F>;
  constexpr int kV = Q::kValues;
  const float scale = stage_fused_row<T, KU>(
      lc, tp, 0, lc.cx.g.me % tp, r, [&](int64_t i) { return fix_reserved<T>(in.at(i)); }, fu, units, in_rows, row,
      warp_buf);
  // My unit u normed and rounded to T, into v.
  const auto normed = [&](int64_t u, float (&v)[kV]) { normed_unit<T>(row, u, scale, fu.weight, v); };
  const int64_t o = r;  // (one DP group: output row = row of the group)
  uint8_t* data = reinterpret_cast<uint8_t*>(out.data) + o * out.data_lanes * 8;
  uint8_t* scales = out.scales + o * out.scale_bytes;
  float v[kV];
  if constexpr (F == kQuantFp8) {
    float a = 0.f;
#pragma unroll 1
    for (int k = 0; k < KU; ++k) {
      const int64_t u = my_lane<kThreads>(k);
      if (u >= units) continue;
      normed(u, v);
      a = fmaxf(a, max_abs(v));
      for (int e = 0; e < kV; ++e) row[u * kV + e] = v[e];  // (my own elements)
    }
    store_fp8_row<T, KU, true>(
        a, v, row, units, o, out.out_rows, warp_buf,
        [&](float scale) { reinterpret_cast<float*>(scales)[0] = scale; }, [&] { return data; });
  } else {
#pragma unroll 1
    for (int k = 0; k < KU; ++k) {
      if ((int64_t)k * kThreads >= units) break;  // uniform over the block: the shuffles below
      const int64_t u = my_lane<kThreads>(k);
      if (u < units) normed(u, v);
      else for (int e = 0; e < kV; ++e) v[e] = 0.f;
      const float amax = group_max(max_abs(v), Q::kGroup);
      if (u >= units || o >= out.out_rows) continue;
      store_block_unit<T, F>(v, amax, global_scale, data, scales, u);
    }
  }
  // (No barrier before the next row: what it stages over, every thread reads only its own
  // elements from here on; the others' it read before block_sum's barriers.)
}

// KU: the units a thread sends (and sums) in a call whose grid is one block a row (fp8, fused),
// else 1. kOwn: own-count mode (own_count.cuh): io.sizes.own is this DP group's count alone.
// kFused: residual add + RMSNorm (fu), one DP group only.
// parts > 0: fp8 rows split over that many blocks each (quantize_fp8_part; KU 1).
template <typename T, int F, int KU, bool kOwn, bool kFused>
__global__ void __launch_bounds__(kThreads)
    lamport_quant_local(GroupArgs g, const __grid_constant__ LamportArgs l, int tp, const uint4* __restrict__ in,
                        Fusion fu, const float* __restrict__ global_scale_ptr, QuantOut out, RowsArg io,
                        int parts) {
  extern __shared__ float4 staged_[];  // rows of several units a thread: each thread's values
  float* row = reinterpret_cast<float*>(staged_);
  __shared__ float warp_buf[kThreads / 32];

  LamportCall lc = begin_lamport_call(g, l, kGatherTokens);
  const int n = g.nranks, dp = n / tp, d = g.me / tp;
  const int64_t row_units = io.row_lanes / 2;
  const EarlyUnits<KU> input = early_units<KU>(in, io.in_rows * row_units);
  const float global_scale = global_scale_ptr ? *global_scale_ptr : 0.f;
  RowCounts rc = lamport_counts(lc, counted<kOwn>(io, d).sizes, dp, row_units);
  if constexpr (kOwn) rc.hash = kOwnCountsHash;
  check_buffers(lc.cx, rc.count(d) > io.in_rows || rc.offset[dp] > io.out_rows);
  // The quantized gathers' fields in the width's high byte (lamport_quant_gather.cu: why).
  const uint64_t width = (uint64_t)row_units * 16 | (uint64_t)quant_fields<F>(kFused, true, true) << 24;
  arrive(lc.cx, make_fingerprint(kGatherTokens, Lane<T>::kDType, lc.algorithm(), (tp - 1) | 8, rc.hash, width));
  if constexpr (kOwn) publish_own_count(lc.cx, io, rc, d);
  const int64_t my_units = rc.count(d) * row_units;
  for (int64_t i = grid_thread(); i < my_units; i += grid_threads()) {
    const uint4 v = fix_reserved<T>(input.at(i));  // load_unit's (zero stays zero)
    lc.cx.everyone().for_each_other([&](int peer) { put_unit(lc.cx, lc.outbox(peer) + i, v); });
  }
  HC_TRACE_EVENT(kTraceSent);
  refill_previous_slot(lc);
  HC_TRACE_EVENT(kTraceRefilled);
  if constexpr (kOwn) learn_counts(lc.cx, io, tp, rc);  // every group's count, for the receive side
  if constexpr (kFused) {
    for (int64_t r = blockIdx.x; r < rc.count(d); r += gridDim.x)  // (dp == 1: every row is my group's)
      quantize_fused_row<T, F, KU>(lc, tp, r, input, fu, row_units, io.in_rows, global_scale, row, warp_buf, out);
  } else if constexpr (F == kQuantFp8) {
    if (KU == 1 && parts > 0) {  // a block a part (the launcher's grid has one for every part of every row)
      const int64_t o = blockIdx.x / parts;
      if (o < rc.offset[dp]) {
        const int od = rc.holder(o, dp, 1);
        quantize_fp8_part<T, KU>(lc, tp, od, o - rc.offset[od], o, (int)(blockIdx.x % parts), parts, input,
                                 row_units, warp_buf, out);
      }
    } else {
      for (int64_t o = blockIdx.x; o < rc.offset[dp]; o += gridDim.x) {  // (uniform over the block)
        const int od = rc.holder(o, dp, 1);
        quantize_fp8_row<T, KU>(lc, tp, od, o - rc.offset[od], o, input, row_units, row, warp_buf, out);
      }
    }
  } else {
    quantize_block_units<T, F, KU>(lc, tp, rc, dp, input, row_units, global_scale, out);
  }
  end_lamport_call(lc, rc.max * row_units);  // group d's ranks each wrote rc.count(d) rows to me
}

// fp8 rows split over blocks (quantize_fp8_part): of spread_grid's block sizes, the smallest that
// gives every part of every row a block of its own within max_blocks (all resident at once);
// none (parts 0) where a row fits one full block, the parts do not fit, or their maxima do not
// fit the area they are published in.
struct SplitGrid {
  Grid grid;
  int parts;
};

inline SplitGrid split_fp8_grid(int64_t rows, int64_t units, const GroupArgs& g, const LamportArgs& l) {
  if (rows < 1 || units <= kThreads) return SplitGrid{{0, 0}, 0};
  for (int threads : kSpreadBlockThreads) {
    const int64_t parts = ceil_div(units, threads);
    if (rows * parts <= g.max_blocks && rows * parts * kLamportUnitBytes <= l.area_bytes)
      return SplitGrid{{(int)(rows * parts), threads}, (int)parts};
  }
  return SplitGrid{{0, 0}, 0};
}

// The launch of one dtype and format: the unquantized gather's grid (a unit a thread, spread:
// launch.cuh spread_grid) for the block formats; fp8 rows split over blocks where they can be
// (split_fp8_grid), else, as fused rows, a block a row of full blocks, KU units a thread (an
// instance each, up to kMaxQuantHidden: 16-bit rows 1408 units, fp32 2816).
template <typename T, int F, bool kFused>
int launch_local(const GroupArgs* g, const LamportArgs* l, int tp, const void* in, const Fusion& fu,
                 const float* global_scale, const QuantOut& out, const RowsArg& io, int64_t hidden, int pdl,
                 cudaStream_t stream) {
  const int64_t rows = grid_rows(io, g->nranks / tp, RowsSpan::kAll, out.out_rows);
  const int64_t units = hidden * (int64_t)sizeof(T) / kLamportUnitBytes;  // a row's
  const auto launch = [&](auto ku, Grid grid, size_t smem, int parts = 0) {
    constexpr int KU = decltype(ku)::value;
    return launch_kernel_smem(io.sizes.own ? lamport_quant_local<T, F, KU, true, kFused>
                                           : lamport_quant_local<T, F, KU, false, kFused>,
                              grid.blocks, grid.threads, smem, stream, pdl, *g, *l, tp, (const uint4*)in, fu,
                              global_scale, out, io, parts);
  };
  if constexpr (F != kQuantFp8 && !kFused) {
    return launch(std::integral_constant<int, 1>{}, spread_grid(rows * units, *g), 0);
  } else {
    if constexpr (!kFused) {
      const SplitGrid split = split_fp8_grid(rows, units, *g, *l);
      if (split.parts) return launch(std::integral_constant<int, 1>{}, split.grid, 0, split.parts);
    }
    const Grid grid{(int)(rows < 1 ? 1 : rows < g->max_blocks ? rows : g->max_blocks), kThreads};
    const size_t smem = quant_staging_bytes(hidden);
    const int64_t ku = ceil_div(units, kThreads);
    if (ku <= 1) return launch(std::integral_constant<int, 1>{}, grid, smem);
    if (ku <= 2) return launch(std::integral_constant<int, 2>{}, grid, smem);
    if (ku <= 3) return launch(std::integral_constant<int, 3>{}, grid, smem);
    return launch(std::integral_constant<int, sizeof(T) == 4 ? 6 : 3>{}, grid, smem);
  }
}

}  // namespace hc

int hc::launch_lamport_quant_local(const GroupArgs* g, const LamportArgs* l, int format, int dtype, int tp,
                                   const void* in, const void* residual, const void* weight, void* residual_out,
                                   float eps, const float* global_scale, void* out_data, void* out_scales,
                                   const int32_t* sizes_device, const int32_t* sizes_host, const int32_t* own_count,
                                   int64_t hidden, int64_t in_rows, int64_t out_rows, int pdl, cudaStream_t stream) {
  // tp >= 2: no partial rows to sum otherwise (quant's path, the launcher's caller); fused: one DP
  // group (the residual of other groups' rows is not here).
  const bool fused = weight != nullptr;
  if (tp < 2 || (fused && (g->nranks != tp || !residual || !residual_out))) return (int)cudaErrorInvalidValue;
  const Fusion fu{(const uint4*)residual, (const uint4*)weight, (uint4*)residual_out, eps};
  int status = (int)cudaErrorInvalidValue;
  HC_DISPATCH_DTYPE(dtype, HC_DISPATCH_QUANT(format, {
    const RowsArg io = rows_arg(sizes_device, sizes_host, g->nranks / tp, hidden * sizeof(Elem), in_rows, out_rows,
                                own_count);
    const QuantOut out = quant_out<Fmt>(hidden, out_data, out_scales, out_rows);
    status = fused ? launch_local<Elem, Fmt, true>(g, l, tp, in, fu, global_scale, out, io, hidden, pdl, stream)
                   : launch_local<Elem, Fmt, false>(g, l, tp, in, fu, global_scale, out, io, hidden, pdl, stream);
  }));
  return status;
}
