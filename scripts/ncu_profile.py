"""Nsight Compute profiles of our kernels at decode sizes, on the GPUs there are (2 or 4).

    python3 scripts/ncu_profile.py --out DIR [--world N] [--set full] [--cases WORDS] [--stalls] [--share-gpus]
                                   [--hidden H] [--sass]

Spawns `world` ranks (NCCL); rank 0 runs under `ncu` with profiling off except around one
call per case (cudaProfilerStart/Stop), so only that call's kernel is profiled; the other
ranks run plainly. Writes DIR/ncu_rank0.txt (ncu's details page per kernel, in case order); with
--sass also the report and its source page (sass_rank0.csv: per SASS instruction, how often it ran
and where warps stalled -- which instructions a kernel's time goes to).

What the numbers mean: ncu replays a kernel many times (one pass per group of counters),
restoring rank 0's memory before each pass. So rank 0 launches its profiled call only after
its peers have launched theirs and their data has landed in its receive buffers: every pass
then finds the data already there and measures rank 0's own work -- launch, prologue, sends,
polling, the reduction, the epilogue -- but not the wait for the slowest peer. ncu also
locks clocks to base and flushes caches between passes, so durations are higher than in the
benchmarks; compare kernels with each other, and read throughput and stall reasons.

--stalls: instead of the section set, the warp stall reasons per issued instruction
(smsp__average_warps_issue_stalled_*), with caches and clocks left as the warm-up calls left
them (--cache-control none --clock-control none): a kernel's instruction-fetch stalls
("no_instruction") show only if its code is not already cached from the calls before.

--share-gpus: the ranks share the GPUs there are (rank r on GPU r % count; one GPU is enough),
over gloo instead of NCCL, each Communicator with the SM budget of bench/shared.py. No MPS: the
ranks take turns on the GPU, which costs the profile nothing, since rank 0's profiled kernel finds
its peers' data in place either way. Peer memory is then the same GPU's: compare kernels with
each other (instructions, stalls, spills), not their memory times with an NVLink run's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from datetime import timedelta

CASES = [  # (name, layout name for world 2, for world 4, op, table, size: bytes or tokens per DP rank[, quant])
    ("all_reduce 2 KB, LL one-shot", "dp2", "dp4", "all_reduce", "one_shot", 2048),
    ("all_reduce 2 KB, Lamport one-shot", "dp2", "dp4", "all_reduce", "lamport", 2048),
    ("gather_tokens 16 tokens, DP", "dp2", "dp4", "gather_tokens", "auto", 16),
    ("gather_tokens 256 tokens, DP", "dp2", "dp4", "gather_tokens", "auto", 256),
    ("gather_tokens 16 tokens, TP", "tp2", "dp2xtp2", "gather_tokens", "auto", 16),
    # 1-token rows: our bf16 gather beside the quantized LL kernel (plain rows) and, with partial
    # rows, the one-hop kernel.
    ("gather_tokens 1 token, DP", "dp2", "dp4", "gather_tokens", "auto", 1),
    ("gather_tokens 1 token, DP, quant fp8 LL", "dp2", "dp4", "gather_tokens", "quant_ll", 1, "fp8"),
    ("gather_tokens 1 token, DP, quant nvfp4 LL", "dp2", "dp4", "gather_tokens", "quant_ll", 1, "nvfp4"),
    ("gather_tokens 16 tokens, DP, quant fp8 LL", "dp2", "dp4", "gather_tokens", "quant_ll", 16, "fp8"),
    ("gather_tokens 16 tokens, DP, quant nvfp4 LL", "dp2", "dp4", "gather_tokens", "quant_ll", 16, "nvfp4"),
    ("gather_tokens 1 token, TP, quant fp8 one hop", "tp2", "dp2xtp2", "gather_tokens", "quant_one_hop", 1, "fp8"),
    # The quantized gathers on Lamport (lamport_quant_gather.cu): a row per block at 128 tokens,
    # several rows per block at 512; bf16 Lamport at 512 beside them.
    ("gather_tokens 128 tokens, DP, quant fp8 Lamport", "dp2", "dp4", "gather_tokens", "lamport", 128, "fp8"),
    ("gather_tokens 512 tokens, DP, quant fp8 Lamport", "dp2", "dp4", "gather_tokens", "lamport", 512, "fp8"),
    ("gather_tokens 512 tokens, DP, quant nvfp4 Lamport", "dp2", "dp4", "gather_tokens", "lamport", 512, "nvfp4"),
    ("gather_tokens 512 tokens, DP, bf16 Lamport", "dp2", "dp4", "gather_tokens", "lamport", 512),
    # The bytes floor (bench/quant_floor.py): a quantized gather beside the bf16 one that moves the
    # same bytes (hidden 4096: an fp8 row is 0.50x a bf16 row, an nvfp4 row 0.28x).
    ("gather_tokens 256 tokens, DP, quant fp8 Lamport, same bytes", "dp2", "dp4", "gather_tokens", "lamport", 256,
     "fp8"),
    ("gather_tokens 128 tokens, DP, bf16 Lamport, same bytes", "dp2", "dp4", "gather_tokens", "lamport", 128),
    ("gather_tokens 256 tokens, DP, quant nvfp4 Lamport, same bytes", "dp2", "dp4", "gather_tokens", "lamport", 256,
     "nvfp4"),
    ("gather_tokens 72 tokens, DP, bf16 Lamport, same bytes", "dp2", "dp4", "gather_tokens", "lamport", 72),
    # quant_local (lamport_quant_local.cu) at TP: fp8 a block a row, nvfp4 a unit a thread (spread grid).
    ("gather_tokens 1 token TP quant fp8 local", "tp2", "dp2xtp2", "gather_tokens", "quant_local", 1, "fp8"),
    ("gather_tokens 1 token TP quant nvfp4 local", "tp2", "dp2xtp2", "gather_tokens", "quant_local", 1, "nvfp4"),
    # The fused gather (residual add + RMSNorm): the LL kernel (auto) beside fused_lamport (the
    # "lamport" table); with one DP group at 1 and 128 tokens,
    ("gather_tokens_norm 1 token TP fused LL", "tp2", "tp4", "gather_tokens_norm", "auto", 1),
    ("gather_tokens_norm 1 token TP fused Lamport", "tp2", "tp4", "gather_tokens_norm", "lamport", 1),
    ("gather_tokens_norm 128 tokens TP fused LL", "tp2", "tp4", "gather_tokens_norm", "auto", 128),
    ("gather_tokens_norm 128 tokens TP fused Lamport", "tp2", "tp4", "gather_tokens_norm", "lamport", 128),
    # ... and with several DP groups: DP2 (one hop on Lamport), DP2xTP2 on 4 (two hops on both).
    ("gather_tokens_norm 1 token DP fused LL", "dp2", "dp2xtp2", "gather_tokens_norm", "auto", 1),
    ("gather_tokens_norm 1 token DP fused Lamport", "dp2", "dp2xtp2", "gather_tokens_norm", "lamport", 1),
    # gather_tokens 256 tokens on dp2xtp2 hung under ncu's kernel replay on 4xH200 (2026-11-22,
    # cause not investigated); left out so the other profiles finish.
]
HIDDEN = 4096  # the gathers' row width unless --hidden
WARMUP = 20
PEER_HEAD_START_S = 0.3  # rank 0 launches this long after its peers (see the module docstring)


def _call(comm, op: str, size: int, device, quant: str | None = None, hidden: int = HIDDEN):
    import torch

    from hybridcomm.bench.quant import GLOBAL_SCALE

    if op == "all_reduce":
        x = torch.randn(size // 2, dtype=torch.bfloat16, device=device)
        return lambda: comm.all_reduce(x)
    tokens = [size] * comm.layout.attn_dp
    x = torch.randn(size, hidden, dtype=torch.bfloat16, device=device)
    if op == "gather_tokens_norm":
        residual, weight = torch.randn_like(x), torch.randn(hidden, dtype=x.dtype, device=device)
        return lambda: comm.gather_tokens(x, tokens, residual=residual, norm_weight=weight)
    if quant:
        scale = GLOBAL_SCALE if quant == "nvfp4" else None
        return lambda: comm.gather_tokens(x, tokens, quant=quant, global_scale=scale)
    return lambda: comm.gather_tokens(x, tokens)


STALLS = ["--metrics", r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,"
          "smsp__cycles_active.avg", "--cache-control", "none", "--clock-control", "none"]


def _cases(words: str | None) -> list:
    return [c for c in CASES if not words or any(w in c[0] for w in words.split(","))]


def worker(rank: int, world: int, port: int, words: str | None = None, share_gpus: bool = False,
           hidden: int = HIDDEN) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    import hybridcomm as hc
    from hybridcomm.algorithms import NAMED_TABLES
    from hybridcomm.bench import shared

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    if share_gpus:  # NCCL refuses two ranks on one GPU
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    else:
        dist.init_process_group("nccl", device_id=device)
    budget = {"max_sms": shared.sm_share(world)} if share_gpus else {}
    # Host-side barriers (no kernel on the profiled stream), with a timeout so a failed rank
    # does not leave the others waiting.
    host = dist.new_group(backend="gloo", timeout=timedelta(seconds=120))
    cudart = torch.cuda.cudart()
    for name, layout2, layout4, op, table, size, *quant in _cases(words):
        layout = hc.Layout.parse(layout2 if world == 2 else layout4)
        comm = hc.Communicator(layout, table=NAMED_TABLES[table], **budget)
        call = _call(comm, op, size, device, *quant, hidden=hidden)
        for _ in range(WARMUP):
            call()
        torch.cuda.synchronize()
        dist.barrier(group=host)
        if rank == 0:
            time.sleep(PEER_HEAD_START_S)
            print(f"[ncu] profiling: {name} ({layout.name})", flush=True)
            cudart.cudaProfilerStart()
        call()
        torch.cuda.synchronize()
        if rank == 0:
            cudart.cudaProfilerStop()
        dist.barrier(group=host)
        try:
            comm.check_errors()
        except hc.PeerTimeout as e:  # report and go on: the profile of rank 0 is still valid
            print(f"[ncu] rank {rank}: {name}: {e}", flush=True)
        del comm
    dist.barrier(group=host)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--world", type=int, default=None, help="default: 4 with 4+ GPUs, else 2")
    parser.add_argument("--set", default="full", help="ncu section set")
    parser.add_argument("--cases", default=None,
                        help="only cases whose name contains one of these comma-separated words")
    parser.add_argument("--stalls", action="store_true", help="stall reasons per issued instruction, warm caches")
    parser.add_argument("--share-gpus", action="store_true", help="ranks share the GPUs (one is enough), over gloo")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="row width of the gather cases")
    parser.add_argument("--sass", action="store_true",
                        help="also keep the report (ncu_rank0.ncu-rep) and write its source page: per SASS "
                             "instruction of each kernel, instructions executed and stall samples (sass_rank0.csv)")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.world, args.port, args.cases, args.share_gpus, args.hidden)
        return 0
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if not os.path.exists(ncu):
        print("ncu not found: nothing profiled", file=sys.stderr)
        return 1
    if args.world is None:
        import torch

        args.world = 4 if torch.cuda.device_count() >= 4 else 2
    os.makedirs(args.out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    me = [sys.executable, os.path.abspath(__file__), "--out", args.out, "--world", str(args.world),
          "--port", str(port), "--hidden", str(args.hidden)] + (["--cases", args.cases] if args.cases else []) + \
        (["--share-gpus"] if args.share_gpus else [])
    what = STALLS if args.stalls else ["--set", args.set]
    report = os.path.join(args.out, "ncu_rank0")
    profiled = [ncu, "--profile-from-start", "off", *what, "--target-processes", "application-only",
                "--log-file", report + ".txt"] + (["--export", report, "--print-summary", "none"] if args.sass else [])
    procs = [subprocess.Popen((profiled if r == 0 else []) + me + ["--worker", str(r)]) for r in range(args.world)]
    codes = [p.wait(timeout=900) for p in procs]
    print(f"[ncu] exit codes {codes}; profile: {report}.txt")
    if args.sass:  # exported, so the pages come from the report: details, and source as SASS (no line info)
        for page, name in ((["details"], "ncu_rank0.txt"), (["source", "--print-source", "sass", "--csv"],
                                                            "sass_rank0.csv")):
            with open(os.path.join(args.out, name), "a") as out:
                page_run = subprocess.run([ncu, "--import", report + ".ncu-rep", "--page", *page], stdout=out)
                codes.append(page_run.returncode)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
