"""GPU tests of the fused gather on the Lamport protocol (csrc/lamport_fused_tokens.cu, algorithm
fused_lamport) on 2, 4 or 8 GPUs (conftest.gpu_world; skipped with fewer).

Every layout of the world, eager, forced through the "lamport" table: fp32 / fp16 / bf16, random
data and data carrying the reserved pattern, uneven counts with zeros, host and device-side
counts, partial and replicated rows, hidden sizes from 64 to the staging's limit, and more rows
than the grid has blocks (a block then norms several rows). Each result is compared with the
oracle (residual_out bit for bit, the normed rows within the norm's tolerance; NaN rows, from the
reserved pattern, by position) and, bit for bit, with the LL kernel's (`fused`, the built-in
table's choice) given the same inputs: both sum a row's squares in the same order. The Lamport
kernel must have run in every case but the rows wider than its staging, which the backend gives
to the LL kernel. Graph replays with new device-side and own counts: test_gpu.py and
test_gpu_counts.py run the "lamport" table's fused gather too.
"""

import random

import pytest
import torch

from conftest import needs_gpus
from test_gpu import WORLD
from hybridcomm import Layout
from hybridcomm.abi import MAX_QUANT_HIDDEN
from hybridcomm.check import Case, call_op, communicator, compare, expected, poisoned_outputs, raw_bytes

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

LAMPORT_KERNEL = "lamport_gather_tokens_norm"


def lamport_runs(case: Case) -> bool:
    """Rows up to the staging's limit run the Lamport kernel; wider ones the LL kernel."""
    return case.row_shape[-1] <= MAX_QUANT_HIDDEN


def fused_cases(seed: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for layout in Layout.all_for_world(WORLD):
        dp = layout.attn_dp
        for dtype in ("float32", "bfloat16", "float16"):
            for data in ("randn", "reserved"):
                for device_sizes in (False, True):
                    for partial in (True, False):
                        sizes = tuple(rng.randint(0, 5) for _ in range(dp))
                        sizes = sizes[:-1] + (0,) if dp > 1 and rng.random() < 0.5 else sizes
                        cases.append(Case("gather_tokens", layout, sizes, row_shape=(64,), dtype=dtype, data=data,
                                          partial=partial, fused=True, device_sizes=device_sizes,
                                          seed=rng.randrange(1 << 30)))
        # Wide rows: 1, 2 and 3 units a thread in 16 bits (hidden 4096, 7168, 11264), 2 and 6 in fp32
        # (hidden 2048, at the staging's limit); more rows than blocks; rows past the limit (the LL
        # kernel runs them). Random data (a row holding the reserved pattern is NaN after the norm,
        # which would leave the norm's values unchecked), and once the reserved pattern.
        for hidden, dtype, rows, data in [(4096, "bfloat16", 3, "randn"), (7168, "bfloat16", 2, "randn"),
                                          (11264, "float16", 2, "randn"), (2048, "float32", 3, "randn"),
                                          (11264, "float32", 2, "randn"), (4096, "bfloat16", 200, "randn"),
                                          (11280, "bfloat16", 2, "randn"), (7168, "bfloat16", 2, "reserved")]:
            sizes = tuple(rows if d else max(rows // 3, 1) for d in range(dp))
            cases.append(Case("gather_tokens", layout, sizes, row_shape=(hidden,), dtype=dtype, data=data,
                              fused=True, device_sizes=rows > 100, seed=rng.randrange(1 << 30)))
    return cases


def oracle_mismatch(got: tuple, want: tuple) -> str:
    """check.compare of (normed, residual_out), except that where the oracle holds a NaN only the
    position must agree: torch and our kernels round a NaN to 16 bits with different payloads
    (test_gpu_lamport.py), and data carrying the reserved pattern makes NaN rows."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape == w.shape and not torch.equal(torch.isnan(g), torch.isnan(w)):
            return f"output {i}: NaN at {int((torch.isnan(g) != torch.isnan(w)).sum())} other positions"
    numbers = lambda ts: tuple(torch.where(torch.isnan(t), torch.zeros_like(t), t) for t in ts)  # noqa: E731
    return compare(numbers(got), numbers(want), "sums", fused=True)


def _run(cases: list[Case]) -> list[tuple[str, str]]:
    """Worker: (case, what is wrong or '') per case."""
    import hybridcomm.kernels as kernels

    launched = []
    lamport = kernels.IMPLS[LAMPORT_KERNEL]

    def counting(*args):
        launched.append(1)
        return lamport(*args)

    kernels.IMPLS[LAMPORT_KERNEL] = counting
    results = []
    try:
        with poisoned_outputs():
            for case in cases:
                ll, forced = communicator(case.layout, "auto", "auto"), communicator(case.layout, "auto", "lamport")
                before = len(launched)
                got = call_op(forced, case, forced.device)
                forced.check_errors()
                ran = len(launched) > before
                reference = call_op(ll, case, ll.device)
                ll.check_errors()
                problems = [oracle_mismatch(got, expected(case, forced.rank, forced.device))]
                if ran != lamport_runs(case):
                    problems.append(f"the Lamport kernel {'ran' if ran else 'did not run'}")
                for name, a, b in zip(("normed", "residual_out"), got, reference):
                    if raw_bytes(a) != raw_bytes(b):
                        problems.append(f"{name} differs from the LL kernel's")
                results.append((case.describe(), "; ".join(p for p in problems if p)))
    finally:
        kernels.IMPLS[LAMPORT_KERNEL] = lamport
    return results


@pytest.mark.timeout(900)
def test_fused_lamport_matches_the_oracle_and_the_ll_kernel_bit_for_bit(pool):
    per_rank = pool(WORLD, "cuda").run(_run, fused_cases(seed=17), timeout=600)
    failures = [f"rank {r}: {c}: {d}" for r, outs in enumerate(per_rank) for c, d in outs if d]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:30])
