"""What the NCCL path's residual add + RMSNorm costs, as written (hybridcomm.norm.add_rms_norm:
fp32 torch ops) against fused forms an engine would use, in CUDA graph replay on one GPU, and
how far each is from the reference bits.

    python3 scripts/norm_baseline.py [--rows 1,16,64,256] [--hidden 2048,4096,7168] [--out FILE]

Forms: `torch ops` (add_rms_norm as it is), `add + F.rms_norm` (a bf16 add, then torch's
rms_norm), `compiled` (add_rms_norm through torch.compile, one shape each), `our kernel`
(csrc/add_rms_norm.cu, what the NCCL baseline runs since 2026-11-24). Prints µs per call
(median of 5 repeats of 200 calls in one graph) and kernels per call (torch.profiler), and the
largest difference from `torch ops` in units of the output's last place.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def forms():
    from hybridcomm.norm import add_rms_norm

    def rms_norm_fn(reduced, residual, weight, eps):
        out = reduced + residual
        return F.rms_norm(out, (out.shape[-1],), weight, eps), out

    from hybridcomm import kernels

    return {"torch ops": add_rms_norm, "add + F.rms_norm": rms_norm_fn,
            "compiled": torch.compile(add_rms_norm, dynamic=False), "our kernel": kernels.add_rms_norm}


def kernels_per_call(fn) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / 10


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    return int((ia - ib).abs().max()) if a.numel() else 0


def main() -> None:
    from hybridcomm.bench.timing import graph_us

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)  # the timer's barriers
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,16,64,256")
    parser.add_argument("--hidden", default="2048,4096,7168")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    torch._dynamo.config.recompile_limit = 64  # `compiled`: one version per shape
    fns = forms()
    lines = [f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, bf16",
             f"{'hidden':>6} {'rows':>5} " + " ".join(f"{name + ' us':>20} {'kernels':>7} {'ulps':>5}" for name in fns)]
    for hidden in map(int, args.hidden.split(",")):
        for rows in map(int, args.rows.split(",")):
            g = torch.Generator(device="cuda").manual_seed(rows * 7 + hidden)
            reduced = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
            residual = torch.randn(rows, hidden, device="cuda", generator=g).bfloat16()
            weight = torch.randn(hidden, device="cuda", generator=g).bfloat16()
            want = fns["torch ops"](reduced, residual, weight, 1e-6)
            cells = []
            for fn in fns.values():
                call = lambda: fn(reduced, residual, weight, 1e-6)  # noqa: E731
                got = call()
                us = graph_us(call, 200)
                worst = max(ulps(got[0], want[0]), ulps(got[1], want[1]))
                cells.append(f"{us:20.2f} {kernels_per_call(call):7.1f} {worst:5d}")
            lines.append(f"{hidden:6d} {rows:5d} " + " ".join(cells))
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
