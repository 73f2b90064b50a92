"""Where an eager call's host time goes: cProfile of rank 0 over many back-to-back calls of
each op (1 token, hidden 1024, bf16), next to the wall clock per call and torch.distributed's.

    python3 scripts/eager_profile.py --world 2 [--attn-tp 1] [--calls 300] [--top 25]

Needs GPUs (NCCL + our kernels). Prints, per op: µs per call (ours, torch.distributed) and
the functions with the most own time (tottime) in our call.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch
import torch.distributed as dist


def _profile(world: int, attn_tp: int, calls: int, top: int) -> str:
    import hybridcomm as hc
    from hybridcomm.bench import timing
    from hybridcomm.bench.eager import eager_calls

    layout = hc.Layout(world_size=world, attn_tp=attn_tp)
    report = io.StringIO()
    with hc.Communicator(layout) as comm:
        for op, (ours, theirs) in eager_calls(comm).items():
            us, them = timing.eager_us(ours, calls), timing.eager_us(theirs, calls)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(calls):
                ours()
            torch.cuda.synchronize()
            prof.disable()
            print(f"\n## {op}: hybridcomm {us:.1f} us/call, torch.distributed {them:.1f} us/call", file=report)
            pstats.Stats(prof, stream=report).sort_stats("tottime").print_stats(top)
    return report.getvalue() if dist.get_rank() == 0 else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="ranks (one GPU each)")
    parser.add_argument("--attn-tp", type=int, default=1, help="attention TP size of the layout")
    parser.add_argument("--calls", type=int, default=300, help="calls per op")
    parser.add_argument("--top", type=int, default=25, help="functions listed per op")
    args = parser.parse_args()
    from hybridcomm.spmd import SpmdPool

    with SpmdPool(args.world, "cuda") as pool:
        print(pool.run(_profile, args.world, args.attn_tp, args.calls, args.top, timeout=600)[0])


if __name__ == "__main__":
    main()
