"""Quantized gathers (hybridcomm.quant) on gloo workers, and the quantizers themselves.

Every format x every layout of worlds 1, 2, 4 x uneven counts including zero x host and
device-side counts: data and scales bit for bit equal to the reference quantizer applied
to the reference (unquantized) result, dequantized values within the format's bound."""

import pytest
import torch

from hybridcomm import Layout
from hybridcomm.quant import FORMATS, QuantizedRows, quantize, swizzle_128x4
from hybridcomm.quant.check import HIDDEN, check_quant_cases, compare_quantized, quant_cases, quant_failures
from hybridcomm.quant.reference import e2m1_codes, to_e4m3
from hybridcomm.quant.swizzle import swizzled_offset


def run_quant_checked(pool, world, qcases, exact="all"):
    failures = quant_failures(qcases, pool(world).run(check_quant_cases, qcases, "auto", "auto", exact, timeout=280))
    assert not failures, "\n".join(failures[:20])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_quantized_gathers_bit_equal_to_quantized_reference(pool, world):
    qcases = [q for lay in Layout.all_for_world(world) for q in quant_cases(lay, seed=world)]
    run_quant_checked(pool, world, qcases)


@pytest.mark.timeout(300)
def test_quantized_gathers_fp32_and_fp16_inputs(pool):
    lays = [Layout(2), Layout(2, attn_tp=2)]
    qcases = [q for lay in lays for q in quant_cases(lay, dtypes=("float32", "float16"), device_sizes=(False,), seed=7)]
    run_quant_checked(pool, 2, qcases)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("exact", ["own_norm", "bound"])
def test_the_gpu_tests_comparisons_run_on_cpu(pool, exact):
    """test_gpu_quant.py compares fused cases with our own normed rows and NCCL within the
    bound: the same checks on the reference backend (where both must pass)."""
    qcases = [q for lay in (Layout(2), Layout(2, attn_tp=2)) for q in quant_cases(lay, seed=11)]
    run_quant_checked(pool, 2, qcases, exact)


# -- bad input ------------------------------------------------------------------------------
def _bad_call(kind):
    import torch.distributed as dist  # noqa: F401
    import hybridcomm as hc
    from hybridcomm.check import communicator

    comm = communicator(hc.Layout(2))
    x = torch.randn(3, 256)
    calls = {
        "unknown format": lambda: comm.gather_tokens(x, [3, 3], quant="int4"),
        "hidden not a multiple": lambda: comm.gather_tokens(torch.randn(3, 200), [3, 3], quant="fp8_block128"),
        "nvfp4 hidden not a multiple": lambda: comm.all_gather_v(torch.randn(3, 24), [3, 3], quant="nvfp4",
                                                                  global_scale=1.0),
        "missing global scale": lambda: comm.all_gather_v(x, [3, 3], quant="nvfp4"),
        "bad global scale": lambda: comm.all_gather_v(x, [3, 3], quant="nvfp4", global_scale=-2.0),
        "global scale tensor dtype": lambda: comm.all_gather_v(x, [3, 3], quant="nvfp4",
                                                               global_scale=torch.ones(1, dtype=torch.float64)),
        "global scale for fp8": lambda: comm.all_gather_v(x, [3, 3], quant="fp8", global_scale=1.0),
        "integer dtype": lambda: comm.all_gather_v(torch.ones(3, 256, dtype=torch.int32), [3, 3], quant="fp8"),
        "3-d rows": lambda: comm.all_gather_v(torch.randn(3, 2, 128), [3, 3], quant="fp8"),
    }
    try:
        calls[kind]()
    except ValueError as e:
        return str(e)
    return None


BAD = {"unknown format": "quant", "hidden not a multiple": "200", "nvfp4 hidden not a multiple": "16",
       "missing global scale": "global_scale", "bad global scale": "global_scale",
       "global scale tensor dtype": "float64", "global scale for fp8": "global_scale",
       "integer dtype": "int32", "3-d rows": "2-d"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", list(BAD))
def test_bad_input_raises_value_error_on_every_rank(pool, kind):
    messages = pool(2).run(_bad_call, kind)
    for m in messages:
        assert m is not None and BAD[kind] in m, m


# -- the quantizers against hand-computed values ------------------------------------------------
def test_e2m1_rounds_to_nearest_even_and_saturates():
    q = torch.tensor([0.0, 0.2, 0.25, 0.26, 0.5, 0.75, 1.0, 1.25, 1.3, 1.5, 1.75, 2.0, 2.5, 2.6, 3.0,
                      3.5, 4.0, 5.0, 5.01, 6.0, 7.0, 1e30, -0.0, -0.25, -0.75, -5.0, -100.0])
    # zero is always code 0 (+0), also -0.0 and negatives that round to zero (-0.25 ties to 0)
    want = [0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4, 5, 5,
            6, 6, 6, 7, 7, 7, 7, 0, 0, 8 | 2, 8 | 6, 8 | 7]
    assert e2m1_codes(q).tolist() == want


def test_e4m3_saturates_and_rounds_to_nearest_even():
    v = torch.tensor([448.0, 460.0, 1e6, -1e6, 2.0 ** -10, 3 * 2.0 ** -11, 1.5 * 2.0 ** -9, 17.0, 19.0])
    got = to_e4m3(v).float().tolist()
    # 2^-10: tie between 0 and 2^-9 -> 0; 17: tie between 16 and 18 -> 16 (even); 19: 18 or 20 -> 20
    assert got == [448.0, 448.0, 448.0, -448.0, 0.0, 2.0 ** -9, 2.0 ** -8, 16.0, 20.0]


def test_fp8_per_token_by_hand():
    x = torch.zeros(2, 128)
    x[0, 0], x[0, 1], x[0, 2] = 3.5, -1.75, 0.001
    q = quantize(x, "fp8")
    scale = torch.tensor(3.5) / torch.tensor(448.0)
    assert q.scales.shape == (2, 1) and q.scales[0, 0] == scale
    inv = torch.tensor(1.0) / scale
    assert q.data[0, :3].float().tolist() == [448.0, -224.0, to_e4m3(torch.tensor(0.001) * inv).item()]
    # all-zero row: the amax floor 1e-10 gives a finite scale and zero data
    assert q.scales[1, 0] == torch.tensor(1e-10, dtype=torch.float32) / torch.tensor(448.0)
    assert (q.data[1].float() == 0).all()


def test_fp8_block128_scales_per_block():
    x = torch.zeros(1, 256)
    x[0, 5], x[0, 130] = 2.0, -8.0
    q = quantize(x, "fp8_block128")
    assert torch.equal(q.scales, (torch.tensor([2.0, 8.0]) / torch.tensor(448.0)).view(1, 2))
    assert q.data[0, 5].float() == 448.0 and q.data[0, 130].float() == -448.0


def test_nvfp4_by_hand():
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([6.0, 3.0, -1.0, 0.2])  # block 0: amax 6
    g = torch.tensor([2.0])
    q = quantize(x, "nvfp4", g)
    # s = 2 * (6 / 6) = 2 -> e4m3 2.0; inv = 2 / 2 = 1; codes 6->7, 3->5, -1->8|2, 0.2->0
    assert q.scales.float().tolist() == [[2.0, 0.0]]
    assert q.data[0, :2].tolist() == [7 | (5 << 4), (8 | 2) | (0 << 4)]
    assert (q.data[0, 8:] == 0).all()  # the all-zero block: scale 0, codes 0
    assert torch.equal(q.dequantize()[0, :4], torch.tensor([6.0, 3.0, -1.0, 0.0]))


def test_swizzle_matches_the_cutlass_offsets():
    rows, cols = 130, 6
    scales = torch.arange(rows * cols, dtype=torch.int32).view(rows, cols)
    flat = swizzle_128x4(scales).view(-1)
    assert flat.numel() == 256 * 8
    for r in range(rows):
        for c in range(cols):
            assert flat[swizzled_offset(r, c, cols)] == scales[r, c]
    assert (flat != 0).sum() == rows * cols - 1  # padding is zero (and so is scales[0, 0])


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_dequantized_error_is_within_the_bound_and_the_bound_can_fail(fmt):
    x = torch.randn(7, HIDDEN).bfloat16() * 3
    g = torch.tensor([448 * 6 / x.float().abs().max().item()]) if FORMATS[fmt].needs_global_scale else None
    q = quantize(x, fmt, g)
    assert compare_quantized(q, q, x) == ""
    wrong = QuantizedRows(q.data, q.scales * 2 if fmt != "nvfp4" else
                          (q.scales.float() * 2).to(q.scales.dtype), fmt, q.global_scale)
    assert "bound" in compare_quantized(wrong, wrong, x)
    assert "bytes differ" in compare_quantized(wrong, q, x)


def _engines_path_matches(layout_name, counts, fmt):
    import hybridcomm as hc
    from hybridcomm.bench.quant import QuantThenGather
    from hybridcomm.check import communicator

    layout = hc.Layout.parse(layout_name)
    comm = communicator(layout)
    g = torch.ones(1) * 100.0 if FORMATS[fmt].needs_global_scale else None
    buffers = [torch.zeros(1 << 16, dtype=torch.uint8) for _ in range(5)]
    engines = QuantThenGather(comm, buffers, fmt, 256, g)
    torch.manual_seed(comm.rank // layout.attn_tp)  # replicated over attn-TP: x + x is exact in any dtype
    x = engines.input(counts[comm.groups["attn_dp"].index])
    x.copy_(torch.randn(x.shape).to(x.dtype))
    data, scales = engines.gather(x, counts)
    want = comm.gather_tokens(x, counts, quant=fmt, global_scale=g)
    return torch.equal(data, want.data.view(torch.uint8)) and torch.equal(scales, want.scales.view(torch.uint8))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["dp2", "tp2"])
def test_the_benchmarks_engine_path_moves_the_same_bytes(pool, layout):
    """bench quant's quantize-then-NCCL baseline (here over gloo, which needs even counts)
    gathers what we gather."""
    counts = [3, 3] if layout == "dp2" else [4]
    for fmt in FORMATS:
        assert all(pool(2).run(_engines_path_matches, layout, counts, fmt))


# -- the reserved pattern: no wire word of the Lamport kernel is 0xFFFFFFFF (docs/quantization.md) --
SENTINEL = -1  # 0xFFFFFFFF as int32
NVFP4_STAND_IN = 0x88888888 - (1 << 32)  # the word the Lamport wire sends for it (nvfp4 data only)


def _words(t: torch.Tensor) -> torch.Tensor:
    """Each row's bytes as int32 words, padded with zero bytes to 16 (as the Lamport wire)."""
    b = t.contiguous().view(torch.uint8)
    pad = -b.shape[1] % 16
    return torch.cat([b, b.new_zeros((b.shape[0], pad))], dim=1).view(torch.int32)


def _wire_words(q: QuantizedRows) -> torch.Tensor:
    data = _words(q.data)
    if q.format == "nvfp4":  # lamport_quant_gather.cu's swap
        assert not (data == NVFP4_STAND_IN).any(), "0x88888888 is real nvfp4 data: the swap is ambiguous"
        data = torch.where(data == SENTINEL, NVFP4_STAND_IN, data)
    return torch.cat([data.flatten(), _words(q.scales).flatten()])


def test_e4m3_nan_is_0x7f_whatever_its_sign():
    v = torch.tensor([float("nan"), -float("nan"), 1.0, -1.0])
    v = torch.cat([v, (v[:1].view(torch.int32) | (1 << 31)).view(torch.float32)])  # a NaN with the sign bit
    assert to_e4m3(v).view(torch.uint8).tolist() == [0x7F, 0x7F, 0x38, 0xB8, 0x7F]


def test_nvfp4_eight_minus_six_is_the_sentinel_word_in_data_only():
    """A block of -6.0s (its amax) packs to 0xFF bytes: sentinel words, which the wire swaps;
    its scale and every other word differ from the sentinel."""
    x = torch.randn(3, 64)
    x[1, 16:32] = -6.0
    x[2, :] = -6.0
    q = quantize(x, "nvfp4", torch.tensor([448.0 * 6 / 6.0]))
    words = _words(q.data)
    assert (words[1, 2:4] == SENTINEL).all() and (words[2, :] == SENTINEL).all()
    assert not (_wire_words(q) == SENTINEL).any()
    assert (q.dequantize()[2] == -6.0).all()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_no_wire_word_is_the_sentinel_for_negative_inputs(fmt):
    """Rows of negative values (all quantizing to nvfp4 code 0xF or to zero: -0 codes 0x8 must
    not appear) and of tiny negatives that round to zero."""
    torch.manual_seed(5)
    neg = -(torch.rand(8, 256) * 6)
    tiny = torch.full((2, 256), -1e-3)
    tiny[:, ::16] = 100.0  # each block's amax: -1e-3 rounds to zero in nvfp4 (to e4m3 -0 = 0x80 in fp8)
    x = torch.cat([neg, -torch.full((1, 256), 6.0), tiny])
    q = quantize(x, fmt, torch.tensor([448.0]) if FORMATS[fmt].needs_global_scale else None)
    assert not (_wire_words(q) == SENTINEL).any()
    if fmt == "nvfp4":
        codes = torch.stack([q.data & 0xF, q.data >> 4], dim=-1)
        assert not (codes == 0x8).any()
        tiny_codes = codes[-2:].reshape(2, 256)
        small = torch.ones(256, dtype=torch.bool)
        small[::16] = False
        assert (tiny_codes[:, small] == 0).all()
    else:
        assert not (q.data.view(torch.uint8) == 0xFF).any()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_nan_rows_are_unsupported_but_never_the_sentinel(fmt):
    """NaN inputs are unsupported (the reference's amax is NaN, the kernels' ignores NaNs, so
    they may disagree), but no word they produce is the sentinel: a Lamport wait cannot hang."""
    x = torch.randn(4, 256)
    x[1, 7] = float("nan")
    x[2, 100] = (torch.tensor([float("nan")]).view(torch.int32) | (1 << 31)).view(torch.float32)
    x[3, :] = float("nan")
    q = quantize(x, fmt, torch.tensor([448.0]) if FORMATS[fmt].needs_global_scale else None)
    assert not (_wire_words(q) == SENTINEL).any()


def test_bench_quant_sizes_its_buffers_for_the_imbalanced_case():
    """bench quant with balanced counts below transitions.IMBALANCED: the imbalanced case's busy
    rank still fits (its buffers were once sized by the largest balanced count: 16 tokens asked
    for, 64 cut from a buffer of 16 -- a shape error on one rank, a PeerTimeout on the other)."""
    from hybridcomm.bench.quant import capacity_tokens
    from hybridcomm.bench.transitions import IMBALANCED

    assert capacity_tokens(["dp2", "tp2"], [1, 4, 16]) == IMBALANCED
    assert capacity_tokens(["tp2"], [1, 4, 16]) == 16  # one DP group: no imbalanced case
    assert capacity_tokens(["dp2"], [1, 256]) == 256


def test_bench_quant_gives_our_calls_the_counts_each_mode_names():
    """bench quant --counts: host a list, device one int32 tensor of every DP group's count
    (the same tensor each call: a graph replays it), own a new Counts of this group's count
    each call (a Counts is exchanged once)."""
    from hybridcomm.bench.quant import COUNTS, _our_counts
    from hybridcomm.counts import Counts

    counts, mine, cpu = [3, 0, 5], 5, torch.device("cpu")
    made = {mode: _our_counts(counts, mode, mine, cpu) for mode in COUNTS}
    assert made["host"]() == counts
    device = made["device"]()
    assert device.dtype == torch.int32 and device.tolist() == counts and made["device"]() is device
    first, second = made["own"](), made["own"]()
    assert isinstance(first, Counts) and first is not second and not first.exchanged
    assert first.own.dtype == torch.int32 and first.own.tolist() == [mine] and first.own is second.own
