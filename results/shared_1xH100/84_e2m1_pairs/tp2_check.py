"""Run 84, call 6: is the TP2 quantized LL gather that took 1389 us at 1024 tokens (nvfp4, hidden
4096, `bench quant`'s 17.8 MB workspace, call 5) right, and what makes it slow? Two ranks on one
GPU under MPS. For each workspace size and token count: the forced `quant` algorithm called 12
times eagerly on new random partial rows, each result compared bit for bit with the reference
backend's; each call's time (CUDA events) printed.

    python3 results/shared_1xH100/84_e2m1_pairs/tp2_check.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))

AREAS = {"bench 1024x4096": 2 * 1024 * 4096 * 2 + (1 << 20), "bench 1024x7168": 2 * 1024 * 7168 * 2 + (1 << 20)}


def check(fmt: str, hidden: int, tokens_list: list[int], algorithm: str) -> list[str]:
    import torch
    import torch.distributed as dist

    from hybridcomm import Communicator, Layout
    from hybridcomm.bench import shared
    from hybridcomm.bench.ops import forced_communicators
    from hybridcomm.bench.quant import GLOBAL_SCALE

    layout = Layout.parse("tp2")
    ref = Communicator(layout, backend="reference")
    g = GLOBAL_SCALE if fmt == "nvfp4" else None
    lines = []
    for area_name, area in AREAS.items():
        comm = forced_communicators(layout, ["gather_tokens_quant"], workspace_bytes=area,
                                    max_sms=shared.sm_share(2), timeout_s=5.0)[f"hc_{algorithm}"].comm
        for tokens in tokens_list:
            times, bad = [], 0
            for it in range(12):
                torch.manual_seed(1000 * it + tokens + dist.get_rank())
                x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                got = comm.gather_tokens(x, [tokens], quant=fmt, global_scale=g)
                end.record()
                end.synchronize()
                comm.check_errors()
                times.append(begin.elapsed_time(end) * 1e3)
                want = ref.gather_tokens(x, [tokens], quant=fmt, global_scale=g)
                same = (torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))
                        and torch.equal(got.scales.view(torch.uint8), want.scales.view(torch.uint8)))
                bad += not same
            lines.append(f"{fmt} h{hidden} {tokens:5d} {algorithm} workspace {area_name} ({area} B): "
                         f"{comm.last_choice.backend}/{comm.last_choice.algorithm}, {bad} of 12 differ from the "
                         f"reference; us per call: " + " ".join(f"{t:.0f}" for t in times))
        comm.close()
    return lines


def main() -> None:
    from hybridcomm.spmd import SpmdPool
    from tp2_check import check as by_name  # the workers import it by its module's name

    with SpmdPool(2, "cuda", share_gpus=True) as pool:
        for fmt, algorithm in (("nvfp4", "quant"), ("fp8", "quant"), ("nvfp4", "quant_lamport")):
            for line in pool.run(by_name, fmt, 4096, [512, 1024], algorithm, timeout=240)[0]:
                print(line, flush=True)


if __name__ == "__main__":
    main()
