"""GPU tests of the small-message kernel shapes (docs/latency.md): one block and several
blocks, for the LL and Lamport one-shot all_reduce.

Sizes straddle every boundary: one lane per thread in one block (<= 4 KB), several blocks
above (csrc/all_reduce.cu kOneShotShapes; a two-lanes-per-thread row for 4-8 KB was measured
slower and removed, the sizes that tested it stay); odd
sizes leave part of a block's threads without a lane. Each is compared bit for bit with the
reference backend on random data, eagerly and as a CUDA graph replayed with fresh data; a rank that skips a call still makes its peers raise
PeerTimeout naming it, whatever the grid.
"""

import time

import pytest
import torch

from conftest import gpu_world, needs_gpus

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

WORLD = gpu_world()
KiB = 1024
# message bytes: 1 block, its edge, then sizes around 8 KB (several blocks), larger
SIZES = (16, 2 * KiB, 4 * KiB, 4 * KiB + 16, 6 * KiB + 48, 8 * KiB, 8 * KiB + 16, 32 * KiB, 128 * KiB + 16)
DTYPES = ("bfloat16", "float32", "float16")
REPLAYS = 8


def _fill(x: torch.Tensor, seed: int) -> None:
    """Random values, different on every rank and every replay (the seed says which)."""
    g = torch.Generator().manual_seed(seed)
    x.copy_(torch.randn(x.numel(), generator=g).to(x.dtype))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (0: identical)."""
    bits = {4: torch.int32, 2: torch.int16}[a.element_size()]
    return int((a.view(bits) != b.view(bits)).sum())


def _all_reduce_against_reference(table: str) -> list[str]:
    import torch.distributed as dist

    import hybridcomm as hc
    from hybridcomm.algorithms import NAMED_TABLES

    rank = dist.get_rank()
    comm = hc.Communicator(hc.Layout(WORLD), table=NAMED_TABLES[table])
    ref = hc.Communicator(hc.Layout(WORLD), backend="reference")
    failures = []
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        for nbytes in SIZES:
            x = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device=comm.device)
            what = f"{table} {dtype_name} {nbytes} B"
            _fill(x, 1000 * rank + nbytes)
            eager = comm.all_reduce(x)
            assert comm.last_choice.backend == "nvlink", f"{what}: ran on {comm.last_choice}"
            if bad := _same_bits(eager, ref.all_reduce(x)):
                failures.append(f"rank {rank} {what} eager: {bad} elements differ")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                comm.all_reduce(x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = comm.all_reduce(x)
            for it in range(REPLAYS):
                _fill(x, 7919 * it + 1000 * rank + nbytes + 1)
                out.fill_(float("nan"))
                graph.replay()
                if bad := _same_bits(out, ref.all_reduce(x)):
                    failures.append(f"rank {rank} {what} replay {it}: {bad} elements differ")
            comm.check_errors()
            del graph
    return failures


@pytest.mark.timeout(600)
@pytest.mark.parametrize("table", ["one_shot", "lamport"])
def test_small_all_reduce_shapes_match_the_reference_bit_for_bit_eager_and_replayed(pool, table):
    per_rank = pool(WORLD, "cuda").run(_all_reduce_against_reference, table, timeout=500)
    failures = [f for rank_failures in per_rank for f in rank_failures]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])


def _skip_a_call(nbytes: int, table: str, timeout_s: float):
    import torch.distributed as dist

    import hybridcomm as hc
    from hybridcomm.algorithms import NAMED_TABLES

    last = dist.get_world_size() - 1
    comm = hc.Communicator(hc.Layout(WORLD), timeout_s=timeout_s, table=NAMED_TABLES[table])
    x = torch.randn(nbytes // 4, device="cuda")
    comm.all_reduce(x)  # everyone
    comm.check_errors()
    if dist.get_rank() == last:  # the last rank skips the second call
        return None
    start = time.monotonic()
    try:
        comm.all_reduce(x)
        comm.check_errors()
        return ("no error", time.monotonic() - start, None)
    except hc.PeerTimeout as e:
        return (str(e), time.monotonic() - start, e.peer)


@pytest.mark.timeout(300)
# (one block x one lane per thread: tests/test_gpu.py's PeerTimeout test, 1 KB)
@pytest.mark.parametrize("nbytes", [8 * KiB, 64 * KiB], ids=["1-block-2-lanes", "blocks"])
@pytest.mark.parametrize("table", ["one_shot", "lamport"])
def test_a_skipped_call_raises_peer_timeout_whatever_the_grid(pool, table, nbytes):
    timeout_s = 0.5
    results = pool(WORLD, "cuda").run(_skip_a_call, nbytes, table, timeout_s, timeout=120)
    for rank in range(WORLD - 1):
        message, elapsed, peer = results[rank]
        assert peer == WORLD - 1, message
        # A deadline, not a speed claim: the kernel must give up, not spin forever.
        assert elapsed < timeout_s + 30, f"rank {rank} took {elapsed:.1f} s"
