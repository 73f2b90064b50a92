"""Eager cost of each op against torch.distributed's (bench/eager.py: wall clock and host
issue time, medians of interleaved rounds), then where our host time goes: cProfile of rank 0
over many back-to-back calls of each op (1 token, hidden 1024, bf16).

    python3 scripts/eager_profile.py --world 2 [--attn-tp 1] [--rounds 7] [--calls 300] [--top 25]
                                     [--json PATH] [--no-profile] [--theirs]

Needs GPUs (NCCL + our kernels). Prints the table (Markdown), then per op the functions with the
most own time (tottime) in our call (--theirs: and in the torch.distributed calls); --json writes
the table with the environment.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats

import torch
import torch.distributed as dist


def _profile(world: int, attn_tp: int, rounds: int, calls: int, top: int, profile: bool,
             theirs: bool = False) -> dict:
    import hybridcomm as hc
    from hybridcomm.bench import timing
    from hybridcomm.bench.eager import eager_calls, eager_table, format_table

    layout = hc.Layout(world_size=world, attn_tp=attn_tp)
    report = io.StringIO()
    with hc.Communicator(layout) as comm:
        table = eager_table(comm, rounds=rounds, calls=calls)
        ops = list(table)
        worst = timing.max_over_ranks([table[op][k] for op in ops for k in sorted(table[op])])
        keys = sorted(table[ops[0]])
        table = {op: dict(zip(keys, worst[i * len(keys):(i + 1) * len(keys)])) for i, op in enumerate(ops)}
        print(format_table(table, f"Eager cost, {layout.name}, max over ranks"), file=report)
        for op, pair in eager_calls(comm).items() if profile else ():
            for side, call in zip(("", "torch.distributed "), pair[:1 + theirs]):
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(calls):
                    call()
                torch.cuda.synchronize()
                prof.disable()
                print(f"\n## {side}{op}: cProfile of {calls} back-to-back calls (rank 0; the profiler inflates "
                      f"times)", file=report)
                pstats.Stats(prof, stream=report).sort_stats("tottime").print_stats(top)
        dist.barrier()
    return {"layout": layout.name, "table": table, "environment": timing.environment(),
            "report": report.getvalue()} if dist.get_rank() == 0 else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="ranks (one GPU each)")
    parser.add_argument("--attn-tp", type=int, default=1, help="attention TP size of the layout")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of ours and theirs")
    parser.add_argument("--calls", type=int, default=300, help="back-to-back calls per wall-clock sample and profile")
    parser.add_argument("--top", type=int, default=25, help="functions listed per op")
    parser.add_argument("--json", help="write the table and environment here")
    parser.add_argument("--no-profile", action="store_true", help="the table only")
    parser.add_argument("--theirs", action="store_true", help="also profile the torch.distributed calls")
    args = parser.parse_args()
    from hybridcomm.spmd import SpmdPool

    with SpmdPool(args.world, "cuda") as pool:
        result = pool.run(_profile, args.world, args.attn_tp, args.rounds, args.calls, args.top,
                          not args.no_profile, args.theirs, timeout=600)[0]
    print(result["report"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: v for k, v in result.items() if k != "report"}, f, indent=1)


if __name__ == "__main__":
    main()
