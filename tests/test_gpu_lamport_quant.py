"""GPU tests of the quantized gathers on the Lamport protocol (csrc/lamport_quant_gather.cu,
algorithm "quant_lamport"), of the LL kernel (csrc/quant_gather.cu, "quant") after the
canonical zero / NaN codes, of the LL kernel with every attention-TP rank summing its
group's rows ("quant_one_hop"), and of gather_tokens' unquantized Lamport one-shot quantizing
where rows land ("quant_local", csrc/lamport_quant_local.cu; its fused path with one DP group;
replicated rows and fused rows of several groups run quant_one_hop there); skipped without 2
GPUs, else world 2, 4 or 8 (conftest.gpu_world).

Data and scales bit for bit equal to the reference quantizer applied to the reference's
unquantized result (fused: to our own unquantized fused rows, test_gpu_quant.py says why),
outputs poisoned first; every format x fp32 / bf16 / fp16 x every layout of the world x host
and device-side counts (uneven, zeros); rows of -3.0 (nvfp4 words of eight -6.0 codes: the
sentinel word, swapped on the wire); graph replays with new device-side counts; and one graph
alternating quantized Lamport gathers with bf16 Lamport and LL ops of the same group (the
Lamport slot rotation is shared by every Lamport op of a group).
"""

import random

import pytest
import torch

from conftest import gpu_world, needs_gpus
from test_gpu_lamport import mismatch
from test_gpu_quant import _run, model_qcases
from hybridcomm import Layout
from hybridcomm.check import Case, communicator, digest, expected, member_input, replay_sizes
from hybridcomm.ops import OPS
from hybridcomm.quant import FORMATS
from hybridcomm.quant.check import QuantCase, compare_quantized, oracle, poison, quant_cases, quant_replay_check, trim

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

# algorithm -> the named table forcing it
TABLES = {"quant_lamport": "lamport", "quant": "quant_ll", "quant_one_hop": "quant_one_hop",
          "quant_local": "quant_local"}


def _layouts() -> list[Layout]:
    """The world's layouts with distinct attention axes (the MoE axes do not touch these ops)."""
    first: dict = {}
    for lay in Layout.all_for_world(gpu_world()):
        first.setdefault((lay.attn_dp, lay.attn_tp), lay)
    return list(first.values())


def _run_forced(pool, qcases, algorithm):
    """The cases of ops that have `algorithm` (quant_local: gather_tokens only), forced to it."""
    qcases = [q for q in qcases if algorithm in [a.name for a in OPS[f"{q.case.op}_quant"].algorithms]]
    _run(pool, qcases, table=TABLES[algorithm], algorithm=algorithm)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", list(TABLES))
def test_every_format_dtype_and_layout_bit_equal_to_the_quantized_reference(pool, algorithm):
    qcases = [q for i, lay in enumerate(_layouts())
              for q in quant_cases(lay, dtypes=("bfloat16", "float32", "float16"), seed=300 + i)]
    _run_forced(pool, qcases, algorithm)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", list(TABLES))
def test_negative_rows_carry_the_sentinel_word_through_the_swap(pool, algorithm):
    """Every other row -3.0: nvfp4 codes 0xF throughout, i.e. data words 0xFFFFFFFF."""
    qcases = [q for i, lay in enumerate(_layouts())
              for q in quant_cases(lay, device_sizes=(False,), seed=400 + i, data="negative")]
    _run_forced(pool, qcases, algorithm)


@pytest.mark.timeout(900)
def test_model_hidden_size_and_rows_ending_in_half_a_unit(pool):
    """hidden 7168 (test_gpu_quant.py's cases), and hidden 48: nvfp4 data of 24 bytes ends in half
    a 16-byte unit, its 3 scale bytes in a unit of padding."""
    world = gpu_world()
    small = [QuantCase(Case("all_gather_v", lay, (40, 0) + (3,) * (world - 2), row_shape=(48,), dtype="float16",
                            data="negative", seed=i), fmt)
             for i, lay in enumerate((Layout(world), Layout(world, attn_tp=2))) for fmt in ("fp8", "nvfp4")]
    _run_forced(pool, model_qcases(7168) + small, "quant_lamport")


def _many_rows_qcases() -> list[QuantCase]:
    """More rows than blocks (one per SM), so a block works several rows one after another, its
    next row loaded while this one is quantized (quant_rows.cuh stage_my_rows): uneven groups, an
    empty one, host and device-side counts (capacity 3 rows more), fused too; each within the
    default workspace (the LL kernel: unquantized rows in half an area)."""
    world = gpu_world()
    qcases = []
    for lay in (Layout(world), Layout(world, attn_tp=2)):
        n = lay.attn_dp
        shapes = ((4096, "bfloat16", [(250,) + (190,) * (n - 1)]),
                  (7168, "bfloat16", [(142,) + (139,) * (n - 1)]),
                  (2048, "float32", [(0,) + (240,) * (n - 1) if n > 1 else (240,)]),
                  (512, "float16", [(601,) + (333,) * (n - 1)]))
        for hidden, dtype, counts in shapes:
            for sizes in counts:
                for fmt in FORMATS:
                    for device_sizes in (False, True):
                        for fused in (False, True) if hidden == 4096 else (False,):
                            case = Case("gather_tokens", lay, sizes, row_shape=(hidden,), dtype=dtype, data="randn",
                                        fused=fused, device_sizes=device_sizes, seed=len(qcases))
                            qcases.append(QuantCase(case, fmt, scale_tensor=device_sizes))
        qcases.append(QuantCase(Case("all_gather_v", lay, (517,) + (3,) * (world - 1), row_shape=(1024,),
                                     dtype="bfloat16", data="negative", seed=len(qcases)), "nvfp4"))
    return qcases


@pytest.mark.timeout(900)
@pytest.mark.parametrize("algorithm", list(TABLES))
def test_more_rows_than_blocks_bit_equal_to_the_quantized_reference(pool, algorithm):
    _run_forced(pool, _many_rows_qcases(), algorithm)


REPLAYS = [("gather_tokens", True, False), ("gather_tokens", False, False), ("gather_tokens", True, True),
           ("all_gather_v", True, False)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("table", ["lamport", "quant_one_hop", "quant_local"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_graph_replays_with_new_device_counts(pool, fmt, table):
    world = gpu_world()
    for lay in (Layout(world), Layout(world, attn_tp=2)):
        for op, partial, fused in REPLAYS:
            n = world if op == "all_gather_v" else lay.attn_dp
            case = Case(op, lay, (1,) * n, row_shape=(512,), dtype="bfloat16", data="randn", partial=partial,
                        fused=fused, device_sizes=True)
            per_rank = pool(world, "cuda").run(quant_replay_check, QuantCase(case, fmt), 8, 24, 5, table,
                                               timeout=600)
            failures = [f"rank {r}: {f}" for r, res in enumerate(per_rank) for f in res["failures"]]
            assert not failures, f"{lay.name} {op} partial={partial} fused={fused}:\n" + "\n".join(failures[:20])
            for it in range(8):  # every rank holds the same gathered bits
                assert len({res["digests"][it] for res in per_rank}) == 1, f"{lay.name} {op} replay {it}"


# -- one graph: quantized Lamport gathers between bf16 Lamport and LL ops of the world group --------
# (kind, op, algorithm, format): "q" = a quantized gather, "bf16" = an unquantized op.
SEQUENCE = [("q", "gather_tokens", "quant_lamport", "nvfp4"), ("bf16", "all_gather_v", "one_shot_lamport", None),
            ("q", "all_gather_v", "quant_lamport", "fp8"), ("q", "gather_tokens", "quant", "fp8_block128"),
            ("bf16", "all_reduce", "one_shot_lamport", None), ("q", "gather_tokens", "quant_lamport", "fp8_block128"),
            ("q", "gather_tokens", "quant_lamport", "fp8"), ("bf16", "all_gather_v", "one_shot", None),
            ("q", "gather_tokens", "quant_one_hop", "fp8"), ("q", "gather_tokens", "quant_local", "fp8"),
            ("bf16", "gather_tokens", "one_shot_lamport", None), ("q", "gather_tokens", "quant_local", "fp8_block128")]


def _interleaved(layout, replays: int, capacity: int, seed: int) -> dict:
    import torch.distributed as dist

    from hybridcomm.arguments import parse_sizes
    from hybridcomm.quant import parse_quant

    comm = communicator(layout)
    nvlink, world, device, rank = comm.backends["nvlink"], comm.groups["world"], comm.device, comm.rank
    n, dp, hidden = world.size, layout.attn_dp, 256
    inputs = [torch.zeros((capacity, hidden), dtype=torch.bfloat16, device=device) for _ in SEQUENCE]
    scale = torch.ones(1, dtype=torch.float32, device=device)
    counts_dev = {"group": torch.full((n,), capacity, dtype=torch.int32, device=device),
                  "dp": torch.full((dp,), capacity, dtype=torch.int32, device=device)}
    sizes = parse_sizes(counts_dev["group"], n, device, "sizes")
    dp_sizes = parse_sizes(counts_dev["dp"], dp, device, "dp_sizes")

    def call(i):
        kind, op, algorithm, fmt = SEQUENCE[i]
        x = inputs[i]
        spec = None if kind == "bf16" else parse_quant(fmt, scale if FORMATS[fmt].needs_global_scale else None,
                                                       x, device)
        if op == "all_reduce":
            return nvlink.all_reduce(x, world, algorithm)
        if op == "gather_tokens":
            return nvlink.gather_tokens(x, dp_sizes, True, None, algorithm, quant=spec)
        return nvlink.all_gather_v(x, sizes, world, algorithm, quant=spec)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(len(SEQUENCE)):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [call(i) for i in range(len(SEQUENCE))]
    rng = random.Random(seed)
    failures, digests = [], []
    for it in range(replays):
        counts = {"group": replay_sizes(rng, n, capacity, it), "dp": replay_sizes(rng, dp, capacity, it)}
        data = "negative" if it % 2 else "randn"
        cases = []
        for i, (kind, op, _, fmt) in enumerate(SEQUENCE):
            op_sizes = (rng.randint(1, capacity),) if op == "all_reduce" else tuple(
                counts["dp" if op == "gather_tokens" else "group"])
            case = Case(op, layout, op_sizes, "world", (hidden,), "bfloat16", data, device_sizes=True,
                        seed=seed * 7919 + it * 31 + i)
            cases.append(case if kind == "bf16" else QuantCase(case, fmt))
            x = inputs[i]
            x.fill_(1e4)  # rows beyond the counts must never be read
            inp = member_input(case, rank, device)
            x[: inp.shape[0]] = inp
        nvfp4 = [oracle(c, rank, device) for c in cases if isinstance(c, QuantCase) and c.quant == "nvfp4"]
        if nvfp4:  # one global scale tensor for the graph: the oracle's (engines' recipe) of the nvfp4 call
            scale.fill_(nvfp4[0][3])
        for key, t in counts_dev.items():
            t.copy_(torch.tensor(counts[key], dtype=torch.int32))
        for o in outs:
            if isinstance(o, torch.Tensor):
                o.fill_(float("nan"))
            else:
                poison(o)
        graph.replay()
        replay_digests = []
        for (kind, op, algorithm, _), case, out in zip(SEQUENCE, cases, outs):
            if kind == "bf16":
                want = expected(case, rank, device)
                got = out[: want.shape[0]]
                detail = mismatch(got, want, op == "all_reduce")
                replay_digests.append(digest(got))
            else:
                want, _, rows, _ = oracle(case, rank, device)
                got = trim(out, rows.shape[0])
                detail = compare_quantized(got, want, rows)
                replay_digests.append(digest((got.data, got.scales)))
            if detail:
                failures.append(f"replay {it} counts {counts} {op}/{algorithm}: {detail}")
        digests.append(replay_digests)
    torch.cuda.synchronize()
    comm.check_errors()
    del graph
    dist.barrier()
    return {"failures": failures[:10], "mismatches": len(failures), "digests": digests}


@pytest.mark.timeout(900)
def test_graph_alternating_quantized_lamport_gathers_with_bf16_lamport_and_ll_ops(pool):
    world = gpu_world()
    for lay in (Layout(world), Layout(world, attn_tp=2)):
        replays = 30
        per_rank = pool(world, "cuda").run(_interleaved, lay, replays, 6, 9, timeout=600)
        for rank, result in enumerate(per_rank):
            assert result["mismatches"] == 0, f"{lay.name} rank {rank}: {result['failures']}"
        for it in range(replays):  # every output here is the same bits on every rank
            assert len({tuple(res["digests"][it]) for res in per_rank}) == 1, f"{lay.name} replay {it}"
