"""Per-rank, per-phase time of small calls, from in-kernel timestamps (the trace build).

    python3 scripts/latency_trace.py --out DIR [--world N] [--cases all_reduce,gather]

Builds the trace variant of the library (csrc/trace.cuh; cached like the normal one), runs each
case of hybridcomm/bench/phases.py CASES on `world` GPUs as CUDA-graph replays, and prints, per
rank, the median ns of every phase of block 0's thread 0 (PDL wait, prologue, store, wait for
peers, unpack, end), the kernel's end and the gap to the previous kernel, and how much later
each peer started than rank 0. Writes DIR/latency_trace.txt and .json. ~1 minute on 2 GPUs
after the build. The trace build's own cost is ~10 timer reads per call: its µs/call runs a
little above the benchmarks'.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for latency_trace.txt / .json")
    parser.add_argument("--world", type=int, default=None, help="ranks (default: 4 with 4+ GPUs, else 2)")
    parser.add_argument("--cases", default=None,
                        help="only cases whose name contains one of these comma-separated words")
    args = parser.parse_args()
    import torch

    from hybridcomm import build
    from hybridcomm.bench import phases
    from hybridcomm.spmd import SpmdPool

    world = args.world or (4 if torch.cuda.device_count() >= 4 else 2)
    cases = [c for c in phases.CASES if not args.cases or any(w in c.name for w in args.cases.split(","))]
    print(f"[trace] building the trace library: {build.build(variant='trace')}", flush=True)
    with SpmdPool(world, "cuda") as pool:
        analyses = pool.run(phases.run_all, cases, timeout=900)[0]
    text = phases.format_report(analyses)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "latency_trace.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "latency_trace.json"), "w") as f:
        json.dump({"world": world, "cases": analyses}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
