"""The selection memo (selection.py) gives the decision made afresh, for every call signature.

The GPU route runs here without GPUs (bench/host.py: fake process group of world 2, meta
tensors, stand-in workspace), so the nvlink backend's checks take part: random calls of every
op, dtype, row width (aligned or not), row counts (zeros, sizes with equal sums, past the
table's thresholds and the workspace), host or device sizes, quantized or not, in random
order, so that a memo entry made by one call is met by other calls of the same signature.
"""

import random

import pytest
import torch
import torch.distributed as dist

import hybridcomm as hc
from hybridcomm import algorithms
from hybridcomm.arguments import parse_sizes
from hybridcomm.bench.host import fake_world, gpu_route_communicator, stand_ins
from hybridcomm.quant import parse_quant

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HIDDEN = (8, 1001, 1024, 4096, 7168)  # 1001: rows not a multiple of 16 bytes (NCCL runs them)
ROWS = (0, 1, 2, 3, 16, 100, 300, 700)  # up to past the 8 MiB rules and the 4 MiB workspace


@pytest.fixture(scope="module")
def comms():
    if dist.is_initialized():
        pytest.skip("torch.distributed already initialised in this process")
    with fake_world(2), stand_ins(None):
        made = [gpu_route_communicator(layout, None) for layout in (hc.Layout(2), hc.Layout(2, attn_tp=2))]
        for comm in made:
            comm.backends["nccl"] = "nccl backend"  # the decision only names it here
        yield made


def _call(comm, rng: random.Random):
    """(op, group, x, sizes, index, quant) of one random call, as the op methods pass them."""
    op = rng.choice(("all_reduce", "all_gather_v", "reduce_scatter_v", "gather_tokens", "gather_tokens_norm",
                     "scatter_tokens", "all_gather_v_quant", "gather_tokens_quant"))
    token_op = op.startswith(("gather_tokens", "scatter"))
    group = comm.groups["world"] if token_op else comm.groups[rng.choice(("world", "attn_tp", "moe_ep"))]
    count = comm.layout.attn_dp if token_op else group.size
    index = comm.groups["attn_dp"].index if token_op else group.index
    sizes = [rng.choice(ROWS) for _ in range(count)]
    dtype, hidden = rng.choice(DTYPES), rng.choice(HIDDEN)
    fmt = rng.choice(("fp8", "fp8_block128", "nvfp4"))
    quant = parse_quant(fmt, 1.0 if fmt == "nvfp4" else None, None, comm.device) if op.endswith("_quant") else None
    on_device = op != "all_reduce" and rng.random() < 0.3
    if op == "all_reduce":
        rows, s = rng.choice(ROWS), None
    elif on_device:
        rows = max(sizes) if op.startswith(("all_gather", "gather")) else sum(sizes)
        s = parse_sizes(torch.tensor(sizes, dtype=torch.int32, device=comm.device), count, comm.device, "sizes")
    else:
        rows = sizes[index] if op.startswith(("all_gather", "gather")) else sum(sizes)
        s = parse_sizes(sizes, count, comm.device, "sizes")
    x = torch.empty(rows, hidden, dtype=dtype, device=comm.device)
    return op, group, x, s, index, quant


def test_memo_equals_a_fresh_decision(comms):
    rng = random.Random(13)
    for comm in comms:
        seen = set()
        for _ in range(3000):
            op, group, x, sizes, index, quant = _call(comm, rng)
            fresh = comm._decide(op, group, x, sizes, index, quant)
            backend, algorithm = comm._select(op, group, x, sizes, index, quant)
            assert comm.last_choice == fresh, (op, group.name, x.shape, sizes, quant)
            assert (backend, algorithm) == (comm.backends[fresh.backend], fresh.algorithm)
            seen.add((fresh.backend, fresh.algorithm))
        # the calls reached every kind of answer: our kernels' algorithms and NCCL
        assert {("nvlink", "one_shot"), ("nvlink", algorithms.LAMPORT), ("nccl", "nccl")} <= seen


def test_a_new_table_drops_the_memo(comms):
    comm = comms[0]
    x = torch.empty(1, 1024, dtype=torch.bfloat16, device=comm.device)
    world = comm.groups["world"]
    saved = comm.table
    try:
        assert comm._select("all_reduce", world, x)[1] == "one_shot"
        comm.table = algorithms.forced({"all_reduce": "two_shot"})
        assert comm._select("all_reduce", world, x)[1] == "two_shot"
    finally:
        comm.table = saved
    assert comm._select("all_reduce", world, x)[1] == "one_shot"


def test_sizes_with_one_sum_but_another_largest_member(comms):
    """The rows one peer receives (the largest size) decide whether the workspace holds them:
    150 + 150 rows of 16 KiB fit the 4 MiB Lamport area, 10 + 290 do not."""
    comm = comms[0]
    world = comm.groups["world"]
    x = torch.empty(300, 4096, dtype=torch.float32, device=comm.device)
    for sizes in ([150, 150], [10, 290], [150, 150]):
        s = parse_sizes(sizes, 2, comm.device, "sizes")
        comm._select("reduce_scatter_v", world, x, s, 0)
        assert comm.last_choice == comm._decide("reduce_scatter_v", world, x, s, 0, None)
        assert comm.last_choice.backend == ("nccl" if max(sizes) == 290 else "nvlink")


def test_while_torch_compile_traces_the_decision_is_made_afresh(comms, monkeypatch):
    comm = comms[1]
    comm._selections.clear()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = torch.empty(2, 1024, dtype=torch.bfloat16, device=comm.device)
    backend, algorithm = comm._select("all_reduce", comm.groups["world"], x)
    assert (backend.name, algorithm) == ("nvlink", "one_shot")
    assert not comm._selections.choices  # nothing remembered: symbolic shapes would not hash
