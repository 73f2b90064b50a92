"""What exchanging the counts inside the gather kernel saves: one decode transition pair
(gather_tokens + scatter_tokens, hidden 4096, bf16) timed as CUDA graph replays on every GPU,
the counts given three ways:

  sizes      every DP group's count, as a device tensor (the engine already knows them all)
  exchanged  hc.Counts(own device tensor) exchanged before the gather by an all-gather
             (counts.exchange: what ops without an in-kernel exchange do)
  in_kernel  hc.Counts(own device tensor) exchanged inside the gather kernel

    PYTHONPATH=src python3 scripts/counts_bench.py [--quant fp8|fp8_block128|nvfp4] [--out results.json]

--quant: the gathers quantize (gather_tokens(..., quant=...); the scatter stays 16-bit).

µs per pair (median per rank, max over ranks). Layouts: every attn_tp of the world.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

HIDDEN = 4096
TOKENS = (1, 16, 128)
MODES = ("sizes", "exchanged", "in_kernel")


def _pair_times(attn_tp: int, quant: str | None) -> list[dict]:
    import torch.distributed as dist

    import hybridcomm as hc
    from hybridcomm.bench.timing import graph_times
    from hybridcomm.counts import exchange

    world = dist.get_world_size()
    layout = hc.Layout(world, attn_tp=attn_tp)
    comm = hc.Communicator(layout)
    device, dp = comm.device, layout.attn_dp
    rows = []
    for tokens in TOKENS:
        x = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16, device=device)
        y = torch.randn(dp * tokens, HIDDEN, dtype=torch.bfloat16, device=device)
        own = torch.full((1,), tokens, dtype=torch.int32, device=device)
        sizes = torch.full((dp,), tokens, dtype=torch.int32, device=device)
        scale = torch.ones(1, dtype=torch.float32, device=device) if quant == "nvfp4" else None
        kw = {} if quant is None else {"quant": quant, "global_scale": scale}

        def pair(mode: str):
            counts = sizes if mode == "sizes" else hc.Counts(own)
            if mode == "exchanged":
                counts = exchange(counts, comm.groups["attn_dp"], device)
            gathered = comm.gather_tokens(x, counts, **kw)
            return comm.scatter_tokens(y, counts), gathered

        for mode in MODES:
            times, _ = graph_times(lambda: pair(mode), calls=20, replays=10)
            us = torch.tensor([statistics.median(times)], device=device)
            dist.all_reduce(us, op=dist.ReduceOp.MAX)
            rows.append({"layout": layout.name, "tokens": tokens, "mode": mode, "us": round(us.item(), 2),
                         "quant": quant})
    comm.close()
    return rows


def main() -> None:
    from hybridcomm.spmd import SpmdPool

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quant", choices=("fp8", "fp8_block128", "nvfp4"), help="the gathers quantize so")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    world = 4 if torch.cuda.device_count() >= 4 else 2
    rows = []
    with SpmdPool(world, "cuda") as pool:
        for attn_tp in (1, world // 2, world) if world == 4 else (1, 2):
            rows += pool.run(_pair_times, attn_tp, args.quant, timeout=300)[0]
    gather = f"gather_tokens (quant={args.quant})" if args.quant else "gather_tokens"
    print(f"{gather} + scatter_tokens, hidden {HIDDEN} bf16, {torch.cuda.get_device_name(0)} x {world}: "
          "µs per pair (graph replay, max over ranks)")
    print(f"{'layout':<10}{'tokens':>7}" + "".join(f"{m:>12}" for m in MODES))
    for layout in dict.fromkeys(r["layout"] for r in rows):
        for tokens in TOKENS:
            us = {r["mode"]: r["us"] for r in rows if r["layout"] == layout and r["tokens"] == tokens}
            print(f"{layout:<10}{tokens:>7}" + "".join(f"{us[m]:>12.2f}" for m in MODES))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
