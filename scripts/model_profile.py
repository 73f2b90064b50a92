"""Where a decode step's compute goes: one rank of a layout, on one GPU, with the token
transitions replaced by a local stand-in that moves nothing (so what is left is the model's own
arithmetic: attention, router, experts, norms, lm_head, and the launches between them).

    python3 scripts/model_profile.py [--config qwen3-30b-a3b] [--layers 4] [--layout dp4]
                                     [--tokens 1,16] [--compile] [--replays 20] [--top 25] [--out DIR]

For each tokens-per-DP-group count it captures the decode step as `bench model` does (a CUDA
graph on bucket-sized buffers, device-side counts), prints the median replay time, then runs
torch.profiler over `--replays` replays and prints the kernels by GPU time per step (how many
launches of each, their total µs per step) and the sum of kernel time against the step time
(the rest is the gaps between kernels). Step time minus kernel time is what launches cost;
kernel time against the weights' bytes / HBM bandwidth is what the kernels themselves lose.
The stand-in's rows are not the other ranks' tokens, so the logits mean nothing here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


class LocalTransitions:
    """The two calls hf.ParallelCausalLM makes, with the shapes a rank of `layout` sees, no
    communication and no arithmetic: gather_tokens repeats this rank's rows attn_dp times (no
    residual add, no norm: on every real path the transition does those), scatter_tokens
    returns this rank's share. Enough to time a rank's compute, not to compute its answer."""

    def __init__(self, layout, rank: int, device: torch.device):
        self.layout, self.rank, self.device = layout, rank, device

    def gather_tokens(self, x, sizes, residual=None, norm_weight=None, eps=1e-6, partial=True):
        return x.repeat(self.layout.attn_dp, 1), residual

    def scatter_tokens(self, y, sizes):
        return y[: y.shape[0] // self.layout.attn_dp]


def profile_point(decoder, dp_counts: list[int], replays: int, top: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    tokens = torch.zeros(dp_counts[decoder.dp_rank], dtype=torch.long)
    decoder.step(tokens, dp_counts)  # captures the graph of this bucket
    step_us = statistics.median(decoder.replay_us(dp_counts, 50) for _ in range(3))
    graph = decoder.graph(dp_counts)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            calls, us = kernels.get(e.name, (0, 0.0))
            kernels[e.name] = (calls + 1, us + e.device_time)
    total = sum(us for _, us in kernels.values()) / replays
    launches = sum(c for c, _ in kernels.values()) / replays
    lines = [f"tokens per DP group {dp_counts}: step {step_us:.1f} µs (graph replay, median), "
             f"kernels {total:.1f} µs in {launches:.0f} launches per step, gaps {step_us - total:.1f} µs",
             f"{'µs/step':>9} {'launches':>8} {'µs each':>8}  kernel"]
    for name, (calls, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{us / replays:9.1f} {calls / replays:8.1f} {us / calls:8.2f}  {name[:110]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen3-30b-a3b")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--layout", default="dp4", help="a bench layout name (dp4, dp2xtp2, tp4, ...)")
    parser.add_argument("--rank", type=int, default=0, help="whose shard and share")
    parser.add_argument("--tokens", default="1,16", help="tokens per DP group, comma-separated")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--compile", action="store_true",
                        help="compile the layers' compute regions (ParallelCausalLM.compile)")
    parser.add_argument("--out", help="also write the report here (DIR/model_profile_<config>_<layout>.txt)")
    args = parser.parse_args()

    from hybridcomm import hf
    from hybridcomm.bench.layer import parse_layout
    from hybridcomm.hf import configs

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    layout = parse_layout(args.layout, None)
    config = configs.make(args.config, args.layers)
    stand_in = LocalTransitions(layout, args.rank, device)
    model = hf.from_config(config, stand_in, seed=0, dtype=torch.bfloat16)
    counts = [int(t) for t in args.tokens.split(",")]
    decoder = hf.Decoder(model, slots=max(counts), max_len=16, graphs=True, device_counts=True)
    if args.compile:
        model.compile()
    regions = "compiled regions" if args.compile else "transformers' modules as they are"
    report = [f"{args.config}, {args.layers} layers, {regions}, rank {args.rank} of {layout.name}, bf16, "
              f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"]
    for t in counts:
        report.append(profile_point(decoder, [t] * layout.attn_dp, args.replays, args.top))
        print(report[-1], flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = f"model_profile_{args.config}_{layout.name}{'_compiled' if args.compile else ''}.txt"
        with open(os.path.join(args.out, name), "w") as f:
            f.write("\n\n".join(report) + "\n")


if __name__ == "__main__":
    main()
