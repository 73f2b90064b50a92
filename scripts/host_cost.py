"""Host µs per eager call of every op on the GPU route, measured without GPUs
(hybridcomm.bench.host says how: fake process group, meta tensors, no-op launchers).

    PYTHONPATH=src python3 scripts/host_cost.py [--calls 2000] [--rounds 9] [--json out.json]
                                                [--against before.json ... [--after after.json ...]]

Layouts DP2 and TP2 (world 2), the calls of hybridcomm.bench.eager (1 token, hidden 1024, bf16).
To compare with an older version, run it with PYTHONPATH=<old checkout>/src after copying
src/hybridcomm/bench/host.py there (it only uses what the library had before), and pass its
--json outputs to --against: a Markdown table then compares the best rounds (the least of all
runs given, on each side) with this run, or with the --after files (then nothing is measured).
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import torch


THEIRS = "torch.distributed "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="back-to-back calls per op and round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument("--against", nargs="*", default=[], help="--json files of another version (before)")
    parser.add_argument("--after", nargs="*", default=[],
                        help="with --against: compare these --json files (after) and measure nothing")
    args = parser.parse_args()
    if args.against and args.after:
        print(compare([_load(p) for p in args.against], [_load(p) for p in args.after]))
        return

    import hybridcomm as hc
    from hybridcomm.bench.eager import eager_calls
    from hybridcomm.bench.host import fake_world, gpu_route_communicator, host_us, stand_ins, stub_library

    lib = stub_library()
    results = {}
    with fake_world(2), stand_ins(lib):
        for name, layout in (("DP2", hc.Layout(2)), ("TP2", hc.Layout(2, attn_tp=2))):
            comm = gpu_route_communicator(layout, lib)
            calls = {}
            for op, (ours, theirs) in eager_calls(comm).items():
                calls[op], calls[THEIRS + op] = ours, theirs
            measured = host_us(calls, args.calls, args.rounds)
            results[name] = {op: us for op, us in measured.items() if not op.startswith(THEIRS)}
            routes = {}
            for op in results[name]:
                calls[op]()
                routes[op] = f"{comm.last_choice.backend}/{comm.last_choice.algorithm}"
            print(f"## {name} (world 2, attn_tp {layout.attn_tp}): host µs per eager call over {args.rounds} "
                  f"rounds of {args.calls} calls: best round, median round; then the torch.distributed "
                  f"calls of bench.eager on the fake process group (their Python and dispatch, no NCCL)")
            for op, us in results[name].items():
                them = measured.get(THEIRS + op)
                print(f"  {op:<20} {us['min']:7.2f} {us['median']:7.2f}   ({routes[op]})" +
                      (f"   torch.distributed {them['min']:7.2f} {them['median']:7.2f}" if them else ""))
    env = {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
           "cpus": os.cpu_count(), "hybridcomm": os.path.dirname(hc.__file__)}
    print("environment:", env)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "calls": args.calls, "rounds": args.rounds, "us_per_call": results},
                      f, indent=1)
    if args.against:
        print(compare([_load(p) for p in args.against], [results]))


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)["us_per_call"]


def compare(before: list[dict], after: list[dict]) -> str:
    """Markdown: per layout and op, the best round over all runs of each side, and their ratio."""
    best = lambda runs, lay, op: min(r[lay][op]["min"] for r in runs)  # noqa: E731
    lines = ["| layout | op | before µs | after µs | after / before |", "|---|---|---|---|---|"]
    for lay, ops in after[0].items():
        for op in ops:
            b, a = best(before, lay, op), best(after, lay, op)
            lines.append(f"| {lay} | {op} | {b:.2f} | {a:.2f} | {a / b:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
