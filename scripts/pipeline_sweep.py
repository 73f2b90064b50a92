"""Sweep of the pipelined two-shot all_reduce's (chunk size, blocks) against the baselines, in
one run: nccl-tests-like lines (time, algbw, busbw) per size and implementation.

    python3 scripts/pipeline_sweep.py --world 2 [--sizes 512K,2M,8M,32M] [--chunks 4K,16K,64K]
        [--blocks 8,16,32] [--workspace-mib N] [--out DIR]

Needs GPUs. Per size: the baselines (NCCL, NCCL with symmetric windows, torch symm_mem one- /
two-shot), the selection table's choice ("hybridcomm"), the bulk two-shot and the Lamport
one-shot forced, and the pipelined two-shot forced with every (chunk, blocks) pair
("pipe <chunk>/<blocks>"). Timing is bench/timing.py's (CUDA graph replays, median of
repeats, max over ranks). The pipelined Communicator has the default workspace (4 MiB per
peer: a message beyond world x 4 MiB runs as several calls of the kernel, as it would in use)
unless --workspace-mib says otherwise. With --out: sweep.json (every record) and sweep.md (the
same lines) there, to fill pipeline.PIPELINE_TABLE from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

KiB, MiB = 1 << 10, 1 << 20
BASELINES = ("nccl", "nccl_symm", "symm_one_shot", "symm_two_shot")
OTHERS = ("two_shot_bulk", "one_shot_lamport")  # our other large-message algorithms, forced


def parse_bytes(text: str) -> int:
    units = {"K": KiB, "M": MiB}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def _timings(sizes: list[int], pairs: list[tuple[int, int]], workspace_bytes: int | None) -> list[dict]:
    """Worker entry (every rank): one record per (size, implementation)."""
    import hybridcomm as hc
    from hybridcomm.algorithms import forced
    from hybridcomm.bench import timing
    from hybridcomm.bench.baselines import NcclSymmetricBuffers, SymmMemBuffer
    from hybridcomm.bench.ops import busbw_gbps
    from hybridcomm.pipeline import PipelineParams

    n = dist.get_world_size()
    layout = hc.Layout(n)
    biggest = max(sizes)
    auto = hc.Communicator(layout)
    pipelined = hc.Communicator(layout, table=forced({"all_reduce": "two_shot_pipelined"}),
                                workspace_bytes=workspace_bytes)
    others = {name: hc.Communicator(layout, table=forced({"all_reduce": name})) for name in OTHERS}
    symm, sm = NcclSymmetricBuffers([biggest], auto.device), SymmMemBuffer(biggest, auto.device)
    records = []
    for nbytes in sizes:
        numel = nbytes // 2
        x = torch.randn(numel, dtype=torch.bfloat16, device=auto.device)
        calls = {"nccl": lambda: dist.all_reduce(x), "hybridcomm": lambda: auto.all_reduce(x)}
        if symm.buffers is not None:
            xs = symm.view(0, (numel,), torch.bfloat16)
            calls["nccl_symm"] = lambda: dist.all_reduce(xs)
        if sm.buffer is not None:
            xm = sm.view(numel, torch.bfloat16)
            calls["symm_one_shot"] = lambda: sm.one_shot(xm)
            calls["symm_two_shot"] = lambda: sm.two_shot(xm)
        for name, comm in others.items():
            comm.all_reduce(x)
            if comm.last_choice.backend == "nvlink":  # else the size is beyond its workspace
                calls[name] = lambda comm=comm: comm.all_reduce(x)
        for chunk, blocks in pairs:
            params = PipelineParams(chunk, blocks)

            def call(params=params):
                pipelined.backends["nvlink"].pipeline = params  # read at launch: a graph keeps it
                return pipelined.all_reduce(x)

            calls[f"pipe {chunk >> 10}K/{blocks}"] = call
        names = list(calls)
        us = timing.max_over_ranks([timing.graph_us(calls[k], timing.calls_per_graph(nbytes)) for k in names])
        label = "hybridcomm (" + auto.last_choice.algorithm + ")"
        for name, t in zip(names, us):
            records.append({"bytes": nbytes, "impl": label if name == "hybridcomm" else name, "us": t,
                            "algbw_GBps": nbytes / (t * 1e-6) / 1e9,
                            "busbw_GBps": busbw_gbps("all_reduce", nbytes, t, n)})
        if dist.get_rank() == 0:
            print(f"[sweep] {nbytes} B: {len(names)} implementations timed", file=sys.stderr, flush=True)
    for comm in [auto, pipelined, *others.values()]:
        comm.close()
    return records


def table(records: list[dict], world: int) -> str:
    """nccl-tests-like lines, per size: baselines, then ours, fastest first; ratio = best
    baseline / this (> 1: faster than every baseline)."""
    lines = [f"# all_reduce sweep, world {world}, bf16 (CUDA graph replay, median, max over ranks)", "",
             f"{'size':>10} {'implementation':<32} {'time(us)':>9} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} "
             f"{'vs best baseline':>17}"]
    for nbytes in sorted({r["bytes"] for r in records}):
        rows = [r for r in records if r["bytes"] == nbytes]
        base = [r["us"] for r in rows if r["impl"] in BASELINES]
        best = min(base) if base else float("nan")
        rows.sort(key=lambda r: (r["impl"] not in BASELINES, r["us"]))
        for r in rows:
            lines.append(f"{nbytes:>10} {r['impl']:<32} {r['us']:>9.2f} {r['algbw_GBps']:>12.1f} "
                         f"{r['busbw_GBps']:>12.1f} {best / r['us']:>16.2f}x")
        pipes = [r for r in rows if r["impl"].startswith("pipe ")]
        if pipes and base:
            top = min(pipes, key=lambda r: r["us"])
            lines.append(f"{nbytes:>10} best pipelined: {top['impl']} {top['us']:.2f} us = {best / top['us']:.2f}x "
                         f"the best baseline ({best:.2f} us)")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="ranks (one GPU each)")
    parser.add_argument("--sizes", default="512K,2M,8M,32M", help="message sizes (bytes; K / M suffixes)")
    parser.add_argument("--chunks", default="4K,16K,64K,256K", help="chunk sizes (powers of two, 1K-512K)")
    parser.add_argument("--blocks", default="8,16,32,64", help="blocks per kernel")
    parser.add_argument("--workspace-mib", type=int, default=0,
                        help="workspace per peer of the pipelined Communicator (0: the default)")
    parser.add_argument("--out", help="directory for sweep.json and sweep.md")
    args = parser.parse_args()
    sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    pairs = [(parse_bytes(c), int(b)) for c in args.chunks.split(",") for b in args.blocks.split(",")]
    from hybridcomm.spmd import SpmdPool

    with SpmdPool(args.world, "cuda") as pool:
        records = pool.run(_timings, sizes, pairs, (args.workspace_mib << 20) or None, timeout=900)[0]
    text = table(records, args.world)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.json").write_text(json.dumps({"world": args.world, "workspace_mib": args.workspace_mib,
                                                    "records": records}, indent=1))
        (out / "sweep.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
