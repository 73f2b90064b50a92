"""Run 84, call 4: which of our quantized gathers at TP2 stops `bench quant --share-gpus` at 1024
tokens (nvfp4, hidden 4096: PeerTimeout on main and on the change, call 3). Two ranks on one GPU
under MPS, the bench's SM budget and workspace; each forced algorithm and the default
Communicator called one at a time, at several token counts, eagerly (call 4) or, with --graphs,
timed as the bench times it (bench/timing.py: graph replays); what each did is printed.

    python3 results/shared_1xH100/84_e2m1_pairs/tp2_probe.py [--graphs] [--hidden-area H] [TOKENS ...]

--hidden-area H: the workspace bench quant makes for 1024 tokens of hidden H (default 7168, as in
call 3; call 5's bench of 1024 tokens at 4096 alone had 4096's).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))

TIMEOUT_S = 5.0


def probe(tokens_list: list[int], fmt: str, hidden: int, area: int, graphs: bool = False) -> list[str]:
    import torch
    import torch.distributed as dist

    from hybridcomm import Communicator, Layout
    from hybridcomm.bench import shared, timing
    from hybridcomm.bench.ops import forced_communicators
    from hybridcomm.bench.quant import GLOBAL_SCALE

    layout = Layout.parse("tp2")
    own = {"workspace_bytes": area, "max_sms": shared.sm_share(2), "timeout_s": TIMEOUT_S}
    comms = {"hybridcomm": Communicator(layout, **own),
             **{k: f.comm for k, f in forced_communicators(layout, ["gather_tokens_quant"], **own).items()}}
    lines, dead = [], set()
    g = GLOBAL_SCALE if fmt == "nvfp4" else None
    for tokens in tokens_list:
        torch.manual_seed(tokens + dist.get_rank())
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
        for name, comm in sorted(comms.items()):
            if name in dead:
                continue
            t0 = time.time()
            try:
                call = lambda c=comm: c.gather_tokens(x, [tokens], quant=fmt, global_scale=g)  # noqa: E731
                us = timing.graph_us(call, timing.calls_per_graph(tokens * hidden * 2)) if graphs else call()
                torch.cuda.synchronize()
                comm.check_errors()
                choice = comm.last_choice
                lines.append(f"{fmt} h{hidden} {tokens:5d} {name:18s} ok    {time.time() - t0:6.2f} s  "
                             f"{choice.backend}/{choice.algorithm}" + (f"  {us:.1f} us" if graphs else ""))
            except Exception as e:  # noqa: BLE001 -- what failed is the finding
                dead.add(name)
                lines.append(f"{fmt} h{hidden} {tokens:5d} {name:18s} ERROR {time.time() - t0:6.2f} s  "
                             f"{type(e).__name__}: {str(e)[:160]}")
    return lines


def main() -> None:
    from hybridcomm.spmd import SpmdPool
    from tp2_probe import probe as by_name  # the workers import it by its module's name, not __main__

    args = sys.argv[1:]
    graphs = "--graphs" in args
    area_hidden = int(args[args.index("--hidden-area") + 1]) if "--hidden-area" in args else 7168
    tokens = [int(t) for i, t in enumerate(args) if t.isdigit() and (i == 0 or args[i - 1] != "--hidden-area")]
    tokens = tokens or [512, 768, 1024]
    area = 2 * 1024 * area_hidden * 2 + (1 << 20)  # bench quant's: its capacity, 1024 tokens of area_hidden
    print(f"workspace {area} bytes", flush=True)
    with SpmdPool(2, "cuda", share_gpus=True) as pool:
        for fmt, hidden in (("fp8", 4096), ("nvfp4", 4096), ("nvfp4", 7168)):
            per_rank = pool.run(by_name, tokens, fmt, hidden, area, graphs, timeout=240)
            print("\n".join(per_rank[0]), flush=True)


if __name__ == "__main__":
    main()
