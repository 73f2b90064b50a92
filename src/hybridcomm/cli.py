"""hybridcomm info | check | build | tune | model | bench {ops,transitions,nodes,quant,pdl,layer,model}

Every command that needs several ranks spawns them itself (gloo on CPU, one GPU per rank
on CUDA); `check` also runs under torchrun (it reads RANK / WORLD_SIZE).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch

from . import cli_args as ca
from .algorithms import NAMED_TABLES
from .bench.quant import COUNTS as QUANT_COUNTS
from .build import VARIANTS
from .layout import Layout
from .ops import OPS
from .table_file import packaged as packaged_tables
from .tune import TOLERANCE


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() > 1 else "cpu"


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- info --------------------------------------------------------------------------------------
def cmd_info(args) -> int:
    from .ops import describe as describe_ops
    from .workspace import DEFAULT_AREA_BYTES, describe_plan

    from . import __version__

    print(f"hybridcomm {__version__}, torch {torch.__version__}")
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        print(f"CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {n} GPU(s)")
        for i in range(n):
            print(f"  GPU {i}: {torch.cuda.get_device_name(i)}")
        print(f"kernels: {_kernel_library()}")
        if n > 1:
            print("peer access (row -> column):")
            print("      " + " ".join(f"{j:>3}" for j in range(n)))
            for i in range(n):
                cells = ["  -" if i == j else ("yes" if torch.cuda.can_device_access_peer(i, j) else " no")
                         for j in range(n)]
                print(f"  {i:>3} " + " ".join(cells))
    else:
        print("CUDA: not available (CPU: reference backend over gloo)")
    layout = args.layout
    print()
    print(layout.rank_table())
    print()
    print(describe_plan(layout, args.workspace_bytes or DEFAULT_AREA_BYTES))
    print()
    print("ops and their kernel algorithms (protocol):")
    print(describe_ops())
    print()
    print(_selection(layout, args.table))
    return 0


def _selection(layout: Layout, table: str | None) -> str:
    """The rules a communicator on `layout` picks kernels by on one node: `table`, else the one a
    Communicator takes by default here (the packaged table of this machine's shape on CUDA)."""
    from .algorithms import node_tables
    from .table_file import describe_for_layout, for_machine

    if table is None and torch.cuda.is_available():
        table = for_machine(layout.ranks_per_node or layout.world_size, torch.cuda.get_device_name(0))
    name = table or "the built-in table, algorithms.TABLE (= tables/4xH200.json)"
    head = f"selection on {layout.attention_name} within a node, by message bytes (table: {name}):"
    return head + "\n" + describe_for_layout(node_tables(table)[1], layout.attention_name)


def _kernel_library() -> str:
    from . import build

    arch = build.device_arch()
    found = build.find(arch)
    if found:
        return str(found)
    try:
        return f"not built for sm_{arch} yet: the first Communicator builds them with {build.nvcc_path()}"
    except RuntimeError as e:
        return f"none for sm_{arch}, and no nvcc to build them ({e}): README, 'Kernels without nvcc'"


# -- check -------------------------------------------------------------------------------------
def _check_layouts(world: int, ranks_per_node: int | None) -> list[Layout]:
    """Every layout of the world, on nodes of `ranks_per_node` ranks where given."""
    return [Layout(world, single.attn_tp, single.moe_tp, ranks_per_node) for single in Layout.all_for_world(world)]


def check_world(world: int, quick: bool, ranks_per_node: int | None = None) -> list:
    from .check import cases_for_layout

    cases = []
    for i, layout in enumerate(_check_layouts(world, ranks_per_node)):
        cases += cases_for_layout(layout, dtypes=("float32", "bfloat16"), device_sizes=(False, True), seed=i)
        if not quick:
            cases += cases_for_layout(layout, dtypes=("bfloat16", "float16"), data="randn", row_shape=(64,),
                                      seed=100 + i)
    return cases


def check_world_quant(world: int, quick: bool, ranks_per_node: int | None = None) -> list:
    """The quantized gathers of every layout: each format (fp8 alone with --quick) x op variant
    (quant.check.quant_cases), uneven counts with a zero, host and device-side counts."""
    from .quant import FORMATS
    from .quant.check import quant_cases

    formats = ("fp8",) if quick else tuple(FORMATS)
    return [q for i, layout in enumerate(_check_layouts(world, ranks_per_node))
            for q in quant_cases(layout, formats=formats, seed=200 + i)]


def _exactness(device: str, backend: str, ranks_per_node: int | None = None) -> tuple[str, str]:
    """How results must match the oracle: (check.run_case's, quant.check.run_quant_case's)."""
    if device == "cpu" or backend == "reference":
        return "all", "all"
    # Across nodes on GPUs a leg inside a node may run on NCCL (where the table or the workspace
    # says so), which sums in its own order; with one rank per node those legs only copy.
    in_node_nccl = ranks_per_node is not None and ranks_per_node > 1
    return ("none", "bound") if backend == "nccl" or in_node_nccl else ("sums", "own_norm")


def check_worker(cases, qcases, backend: str, exactness: tuple[str, str], table: str) -> tuple[list, list]:
    """Worker entry of `check`: (check.check_cases' outcomes, quant.check.check_quant_cases')."""
    from .check import check_cases
    from .quant.check import check_quant_cases

    exact, quant_exact = exactness
    return (check_cases(cases, backend, exact, False, table),
            check_quant_cases(qcases, backend, table, quant_exact))


def _report_check(cases, per_rank, qcases, per_rank_quant) -> int:
    """Per layout, the cases that passed on every rank (quantized ones counted apart), then every
    failure; 0 if none."""
    from .check import failures_of
    from .quant.check import quant_failures

    failures = failures_of(cases, per_rank) + quant_failures(qcases, per_rank_quant)
    by_layout: dict[str, list[int]] = {}  # layout -> [passed, failed, quantized passed, quantized failed]
    for i, case in enumerate(cases):
        ok = all(outs[i].ok for outs in per_rank)
        by_layout.setdefault(case.layout.name, [0, 0, 0, 0])[0 if ok else 1] += 1
    for i, q in enumerate(qcases):
        ok = not any(results[i][0] for results in per_rank_quant)
        by_layout.setdefault(q.case.layout.name, [0, 0, 0, 0])[2 if ok else 3] += 1
    for name, (ok, bad, qok, qbad) in by_layout.items():
        print(f"{name:<22} {ok:>5} cases passed, {bad} failed; quantized {qok:>4} passed, {qbad} failed")
    for f in failures[:50]:
        print("FAIL", f)
    print(f"{'PASS' if not failures else 'FAIL'}: {len(cases)} cases + {len(qcases)} quantized x {len(per_rank)} "
          f"ranks, {len(failures)} failure(s)")
    return 0 if not failures else 1


def cmd_check(args) -> int:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun
        import torch.distributed as dist

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
        world = dist.get_world_size()
        cases = check_world(world, args.quick, args.ranks_per_node)
        qcases = check_world_quant(world, args.quick, args.ranks_per_node)
        mine = check_worker(cases, qcases, args.backend, _exactness(device, args.backend, args.ranks_per_node),
                            args.table)
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        code = _report_gathered(cases, qcases, gathered) if dist.get_rank() == 0 else 0
        dist.destroy_process_group()
        return code
    from .spmd import SpmdPool

    device = ca.check_device(args.device or _default_device(), args.world, args.share_gpus)
    ca.check_backend(args.backend, device)
    cases = check_world(args.world, args.quick, args.ranks_per_node)
    qcases = check_world_quant(args.world, args.quick, args.ranks_per_node)
    _progress(f"[check] {len(cases)} cases and {len(qcases)} quantized over {len(Layout.all_for_world(args.world))} "
              f"layouts of world {args.world} on {device}, backend {args.backend} ...")
    with SpmdPool(args.world, device, share_gpus=args.share_gpus) as pool:
        per_rank = pool.run(check_worker, cases, qcases, args.backend,
                            _exactness(device, args.backend, args.ranks_per_node), args.table, timeout=1800)
    return _report_gathered(cases, qcases, per_rank)


def _report_gathered(cases, qcases, per_rank: list[tuple[list, list]]) -> int:
    return _report_check(cases, [plain for plain, _ in per_rank], qcases, [quant for _, quant in per_rank])


# -- build -------------------------------------------------------------------------------------
def cmd_build(args) -> int:
    from . import build

    arch = args.arch or (build.device_arch() if torch.cuda.is_available() else "90a")
    if args.objects:
        objs = build.compile_objects(arch, Path(args.objects), verbose=True, variant=args.variant)
        print(f"compiled {len(objs)} object(s) for sm_{arch} into {args.objects}")
    else:
        library = build.build(arch, verbose=True, variant=args.variant)
        if args.out:  # e.g. src/hybridcomm/prebuilt before `pip wheel .`: a machine without nvcc loads it
            Path(args.out).mkdir(parents=True, exist_ok=True)
            library = shutil.copy2(library, Path(args.out) / library.name)
        print(library)
    return 0


# -- bench -------------------------------------------------------------------------------------
def _write(results: dict, out: str | None, kind: str) -> None:
    if out:
        from .bench import report

        written, skipped = report.write(results, out, kind)
        _progress("wrote " + ", ".join(str(p) for p in written))
        for why in skipped:
            _progress(f"no plot: {why}")


def cmd_bench_ops(args) -> int:
    from .bench import report
    from .bench.ops import bench_ops

    device = ca.check_device(args.device or _default_device(), args.world, args.share_gpus)
    if args.max_sms and device == "cpu":
        raise ca.UsageError("--max-sms needs --device cuda: it times our kernels (GPUs)")
    results = bench_ops(args.world, device, args.sizes, max_sms=args.max_sms or (), share_gpus=args.share_gpus)
    print(report.ops_markdown(results))
    _write(results, args.out, "ops")
    return 0


def cmd_bench_transitions(args) -> int:
    from .bench import report
    from .bench.transitions import bench_transitions

    ca.check_gpu_run("bench transitions times our CUDA kernels against NCCL: it needs GPUs", args.world, args.layouts,
                     args.share_gpus)
    results = bench_transitions([lay.name for lay in args.layouts], args.world, args.tokens,
                                max_sms=args.max_sms or (), share_gpus=args.share_gpus)
    print(report.transitions_markdown(results))
    _write(results, args.out, "transitions")
    return 0


def cmd_bench_nodes(args) -> int:
    from .bench import report
    from .bench.nodes import bench_nodes

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("bench nodes times GPU ranks across simulated nodes: it needs 2+ GPUs", file=sys.stderr)
        return 2
    world = args.world or torch.cuda.device_count()
    rpn = args.ranks_per_node or world // 2
    default = [f"dp{world}"] + ([f"dp{world // 2}xtp2"] if world >= 4 else [])
    layouts = args.layouts.split(",") if args.layouts else default
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
    reduce, moves = bench_nodes(world, rpn, layouts, tokens=tokens)
    print(report.ops_markdown(reduce))
    print(report.transitions_markdown(moves))
    if args.out:
        out = Path(args.out)
        _write(reduce, str(out.with_name(out.stem + "_all_reduce.json")), "ops")
        _write(moves, str(out.with_name(out.stem + "_transitions.json")), "transitions")
    return 0


def cmd_bench_quant(args) -> int:
    from .bench.quant import bench_quant, quant_markdown

    ca.check_gpu_run("bench quant times our CUDA kernels against NCCL: it needs GPUs", args.world, args.layouts,
                     args.share_gpus)
    results = bench_quant([lay.name for lay in args.layouts], args.quant, args.hidden, args.tokens, args.world,
                          progress=lambda so_far: _write(so_far, args.out, "quant"),  # each piece as it ends
                          share_gpus=args.share_gpus, counts_mode=args.counts)
    print(quant_markdown(results))
    return 0


def _write_with_table(results: dict, table: str, out: str) -> None:
    """The results as JSON at `out`, the printed table as Markdown beside it."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    path.with_suffix(".md").write_text(f"```\n{table}\n```\n")
    _progress(f"wrote {path}, {path.with_suffix('.md')}")


def cmd_bench_pdl(args) -> int:
    from .bench.pdl import bench_pdl, pdl_table

    if not torch.cuda.is_available():
        raise ca.UsageError("bench pdl times our CUDA kernels launched with and without PDL: it needs GPUs "
                            "(torch.cuda.is_available() is False)")
    world = args.world or (4 if torch.cuda.device_count() >= 4 else 2)
    ca.check_device("cuda", world)
    results = bench_pdl(world)
    table = pdl_table(results)
    print(table)
    if args.out:
        _write_with_table(results, table, args.out)
    return 0


def _token_lists(counts: list[int], imbalanced: bool) -> list:
    tokens: list = list(counts)
    if imbalanced:
        tokens += [[64] + [1] * (d - 1) for d in (2, 4, 8)]  # one DP rank busy, the rest nearly idle
    return tokens


def cmd_bench_layer(args) -> int:
    from .bench.layer import _points, bench_layer, format_layer_table
    from .model.config import ModelConfig, dtype_from_name

    layouts = args.layout or [Layout.parse("dp2xtp2")]
    world = ca.same_world(layouts)
    device = ca.check_device(args.device or _default_device(), world)
    cuda = device == "cuda"
    backends = args.backends or (["nccl", "auto"] if cuda else ["reference"])
    for b in backends:
        ca.check_backend(b, device, "--backends")
    config = args.config or ("bench" if cuda else "tiny")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    tokens = _token_lists(args.tokens or ([1, 4, 16, 64, 256] if cuda else [4, 16]), args.imbalanced)
    names = [lay.name for lay in layouts]
    try:  # the model must fit the layouts (heads, experts): a usage error, found before any process starts
        _points(names, tokens, world, ModelConfig.named(config, dtype_from_name(dtype)))
    except ValueError as e:
        raise ca.UsageError(str(e)) from None
    quants = [None if q == "none" else q for q in args.quant or ["none"]]
    results = bench_layer(names, tokens, world, device=device, backends=backends, steps=args.steps,
                          dtype=dtype, config=config, quants=quants)
    print(_timing_note(results["graphs"], device))
    print(format_layer_table(results))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))
        out.with_suffix(".md").write_text(f"{_timing_note(results['graphs'], device)}\n\n```\n"
                                          f"{format_layer_table(results)}\n```\n")
        _progress(f"wrote {out}, {out.with_suffix('.md')} (the layer benchmark draws no plot)")
    return 0


# -- tune --------------------------------------------------------------------------------------
def cmd_tune(args) -> int:
    from . import table_file, tune

    try:
        if args.from_files:
            doc = tune.tune_files(args.from_files, args.tolerance)
        else:
            world = args.world or max(torch.cuda.device_count(), 2)
            layouts = args.layouts or [lay for lay in Layout.all_for_world(world) if lay.moe_tp == 1]
            ca.check_gpu_run("tune measures our CUDA kernels against NCCL and needs GPUs, but "
                             "torch.cuda.is_available() is False here; tuning from results files "
                             "(--from ops.json transitions.json) works everywhere", world, layouts)
            doc = tune.tune(tune.measure(world, layouts, args.sizes, args.out), args.tolerance)
    except tune.ResultsError as e:
        raise ca.UsageError(str(e)) from None
    print(tune.describe(doc))
    if args.out:
        _progress(f"wrote {table_file.write(doc, args.out)} (load it: Communicator(layout, table=path))")
    return 0


# -- model -------------------------------------------------------------------------------------
def cmd_model(args) -> int:
    from . import costmodel

    p = costmodel.Params(net_gbps=args.net_gbps, hop_us=args.hop_us, node_legs=args.node_legs)
    if args.results:
        ours, nccl = costmodel.in_node_legs(Path(args.results))
        p = costmodel.replace(p, ours=ours, nccl=nccl)
    tokens = [int(t) for t in args.tokens.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    for nodes in [int(n) for n in args.nodes.split(",")]:
        world = nodes * args.gpus_per_node
        layouts = args.layouts.split(",") if args.layouts else [f"dp{world}", f"dp{world // 2}xtp2", f"tp{world}"]
        rows = costmodel.predict(nodes, args.gpus_per_node, layouts, tokens, sizes, args.hidden * 2, p)
        print(costmodel.markdown(rows, nodes, args.gpus_per_node, p))
        print()
    return 0


def _timing_note(graphs: bool, device: str) -> str:
    if graphs:
        return "µs per decode step: CUDA graph replay, median of repeats, max over ranks"
    return (f"µs per decode step: eager wall clock on {device} (no CUDA graphs); "
            + ("a development path, not a speed claim" if device == "cpu" else "includes launch overhead"))


def _model_tokens(text: str) -> list:
    """'1,4,64:1,uneven' -> [1, 4, [64, 1], 'uneven']: an int is that many tokens on every DP
    group, a ':' list one count per DP group (run only on layouts with that many groups),
    'uneven' one group with 16 and the others with 1 (layouts with several DP groups)."""
    try:
        items = [item if item == "uneven" else [int(t) for t in item.split(":")] if ":" in item else int(item)
                 for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 1,4,64:1,uneven, got {text!r}") from None
    if any(min(i if isinstance(i, list) else [i]) < 0 for i in items if i != "uneven"):
        raise argparse.ArgumentTypeError(f"counts must be non-negative, got {text!r}")
    return items


def _model_configs(text: str) -> list[str]:
    from .hf.configs import CONFIGS

    names = [t.strip() for t in text.split(",")]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown config {unknown[0]!r}; known: {', '.join(sorted(CONFIGS))}")
    return names


def cmd_bench_model(args) -> int:
    from .bench.model import bench_model, format_model_table, verdict

    device = args.device or _default_device()
    cuda = device == "cuda"
    layouts = args.layout or [Layout.parse("dp2" if cuda and torch.cuda.device_count() < 4 else "dp2xtp2")]
    world = ca.same_world(layouts)
    device = ca.check_device(device, world)
    backends = args.backends or (["nccl", "nccl_symm", "auto"] if cuda else ["reference"])
    for b in backends:
        ca.check_backend(b, device, "--backends")
    configs = args.config or ["qwen3-30b-a3b" if cuda else "qwen3_moe-small"]
    tokens = args.tokens or _model_tokens("1,4,16,64,256,uneven" if cuda else "4,6:2")
    results = bench_model(configs, [lay.name for lay in layouts], tokens, world, device, backends, args.steps,
                          args.dtype or ("bfloat16" if cuda else "float32"), layers=args.layers,
                          check_logits=not args.no_check, seed=args.seed, eager=args.eager, timeout_s=args.timeout,
                          compiled=cuda if args.compile is None else args.compile)
    table = "\n".join([_timing_note(not args.eager and cuda, device), format_model_table(results), verdict(results)])
    print(table)
    if args.out:
        _write_with_table(results, table, args.out)
    return 0 if "FAIL" not in verdict(results) and not results["failed"] else 1


def parser() -> argparse.ArgumentParser:
    p = ca.OneLineParser(prog="hybridcomm", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    layout_help = ("layout: shorthand dp4, dp2xtp2, tp4 (+ ',moe_tp2'), or any world as "
                   "world=6,attn_tp=3,moe_tp=2")
    device_help = "cpu (gloo processes, reference backend) or cuda (one GPU per rank); default: cuda with 2+ GPUs"
    share_help = ("ranks share GPUs (run it under CUDA MPS): our forced algorithms only, to compare two builds of "
                  "the kernels on one GPU; not a speed claim (bench/shared.py)")

    info = sub.add_parser("info", help="versions, GPUs, peer access, a layout's ranks, workspace memory")
    info.add_argument("--layout", type=ca.layout, default="dp2xtp2", help=layout_help + " (default dp2xtp2)")
    info.add_argument("--workspace-bytes", type=ca.workspace_bytes, default=None,
                      help="nvlink workspace per peer, phase and slot: bytes, or with a K/M suffix; a multiple "
                           "of 16 (default 4M)")
    info.add_argument("--table", type=ca.table, default=None,
                      help="show the selection by this table (a name, a packaged table or a `hybridcomm tune` "
                           "file; default: what a Communicator takes here)")
    info.set_defaults(fn=cmd_info)

    check = sub.add_parser("check", help="every op, the quantized gathers included, over every layout of a world "
                                         "against the oracle")
    check.add_argument("--world", type=ca.positive_int, default=4, help="ranks to spawn (default 4)")
    check.add_argument("--device", choices=["cpu", "cuda"], default=None, help=device_help)
    check.add_argument("--backend", choices=list(ca.BENCH_BACKENDS), default="auto",
                       help="force a backend (nccl and nvlink need --device cuda); default auto")
    check.add_argument("--quick", action="store_true", help="integer data only; fp8 alone for the quantized gathers")
    check.add_argument("--share-gpus", action="store_true",
                       help="with fewer GPUs than --world: ranks take turns on them (our kernels run, "
                            "time-sliced; no NCCL: its calls go to the reference backend)")
    check.add_argument("--ranks-per-node", type=ca.positive_int, default=None,
                       help="simulate nodes of this many ranks (groups across them run hierarchically)")
    check.add_argument("--table", type=ca.table, default="auto",
                       help=f"selection table: {', '.join(sorted(NAMED_TABLES))} (hierarchical: our path across "
                            f"nodes at every size), a packaged table ({', '.join(packaged_tables())}) or a "
                            f"`hybridcomm tune` file (default auto)")
    check.set_defaults(fn=cmd_check)

    build = sub.add_parser("build", help="compile the CUDA sources (cached)")
    build.add_argument("--arch", default=None, help="e.g. 90a (default: the current GPU's)")
    build.add_argument("--objects", default=None, help="only compile objects into this folder (CI)")
    build.add_argument("--out", default=None,
                       help="also copy the library into this folder (src/hybridcomm/prebuilt: shipped in a wheel)")
    build.add_argument("--variant", default="", choices=sorted(VARIANTS),
                       help="'trace': the library whose kernels stamp phase boundaries (scripts/latency_trace.py)")
    build.set_defaults(fn=cmd_build)

    model = sub.add_parser("model", help="predicted µs across nodes: flat NCCL vs hierarchical (costmodel.py)")
    model.add_argument("--nodes", default="2,4", help="node counts, comma-separated")
    model.add_argument("--gpus-per-node", type=ca.positive_int, default=8, help="GPUs (ranks) per node (default 8)")
    model.add_argument("--net-gbps", type=float, default=50.0, help="GB/s per GPU and direction (400 Gb/s IB: 50)")
    model.add_argument("--hop-us", type=float, default=5.0, help="µs per network step of a collective")
    model.add_argument("--node-legs", choices=["best", "nccl"], default="best",
                       help="legs in a node: the table's best of ours and NCCL, or NCCL only")
    model.add_argument("--layouts", default=None, help="default: dp<W>, dp<W/2>xtp2, tp<W>")
    model.add_argument("--tokens", default="1,4,16,64,2048,8192", help="tokens per DP group")
    model.add_argument("--sizes", default="2048,32768,262144,1048576,16777216,67108864",
                       help="all_reduce bytes")
    model.add_argument("--hidden", type=int, default=4096, help="bf16 row width of the transitions")
    model.add_argument("--results", default=None, help="a `bench ops --world 4` JSON to take the in-node legs from")
    model.set_defaults(fn=cmd_model)

    tune = sub.add_parser("tune", help="a selection table from measurements (src/hybridcomm/tune.py), as JSON")
    tune.add_argument("--from", dest="from_files", nargs="+", default=None, metavar="RESULTS",
                      help="`bench ops` / `bench transitions` / `bench quant` JSON files to tune from (no GPU "
                           "needed); without it tune runs the three benchmarks (GPUs)")
    tune.add_argument("--world", type=ca.positive_int, default=None, help="ranks to measure on (default: every GPU)")
    tune.add_argument("--layouts", type=ca.layout_list, default=None,
                      help="transitions layouts (default: every attention layout of --world, moe_tp 1)")
    tune.add_argument("--sizes", type=ca.byte_list, default=None, help="bench ops message sizes (default 2K..64M)")
    tune.add_argument("--tolerance", type=ca.fraction, default=TOLERANCE,
                      help=f"times within this fraction of the fastest count as a tie (default {TOLERANCE})")
    tune.add_argument("--out", default=None, help="table JSON path (measured results written beside it)")
    tune.set_defaults(fn=cmd_tune)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    collectives = " / ".join(name for name, spec in OPS.items() if not spec.on_world and not spec.quantized)
    ops = bench.add_parser("ops", help=f"{collectives} sweep vs baselines")
    ops.add_argument("--world", type=ca.positive_int, default=4, help="ranks to spawn (default 4)")
    ops.add_argument("--device", choices=["cpu", "cuda"], default=None, help=device_help)
    ops.add_argument("--sizes", type=ca.byte_list, default=None,
                     help="message sizes, comma-separated: bytes or with a K/M/G suffix, e.g. 2K,1M "
                          "(default 2K..64M)")
    ops.add_argument("--max-sms", type=ca.positive_list, default=None,
                     help="also time the Communicator made with max_sms=N, for each N, e.g. 8,16,32 "
                          "(columns hc_sms<N>; GPUs)")
    ops.add_argument("--share-gpus", action="store_true", help=share_help)
    ops.add_argument("--out", default=None, help="JSON path (.md and, on GPUs, .png written beside it)")
    ops.set_defaults(fn=cmd_bench_ops)

    tr = bench.add_parser("transitions", help="gather_tokens / scatter_tokens vs the two-kernel sequences (GPUs)")
    tr.add_argument("--layouts", type=ca.layout_list, default="dp2xtp2,dp4,tp4",
                    help="comma-separated layouts of --world ranks (default dp2xtp2,dp4,tp4); separate "
                         "key=value layouts with ';'")
    tr.add_argument("--world", type=ca.positive_int, default=4, help="ranks to spawn (default 4)")
    tr.add_argument("--tokens", type=ca.count_list, default=None,
                    help="tokens per DP rank, comma-separated (default 1,2,4,...,512)")
    tr.add_argument("--max-sms", type=ca.positive_list, default=None,
                    help="also time the Communicator made with max_sms=N, for each N (columns hc_sms<N>)")
    tr.add_argument("--share-gpus", action="store_true", help=share_help)
    tr.add_argument("--out", default=None, help="JSON path (.md and .png written beside it)")
    tr.set_defaults(fn=cmd_bench_transitions)

    nodes = bench.add_parser("nodes", help="across simulated nodes: hierarchical vs flat NCCL (GPUs)")
    nodes.add_argument("--world", type=ca.positive_int, default=None, help="default: every GPU")
    nodes.add_argument("--ranks-per-node", type=ca.positive_int, default=None, help="default: world / 2")
    nodes.add_argument("--layouts", default=None, help="default: dp<W> and dp<W/2>xtp2")
    nodes.add_argument("--tokens", default=None, help="tokens per DP rank (default 1,4,16,64,256,1024)")
    nodes.add_argument("--out", default=None, help="JSON path stem (_all_reduce / _transitions .json/.md/.png)")
    nodes.set_defaults(fn=cmd_bench_nodes)

    qb = bench.add_parser("quant", help="quantized gather_tokens vs bf16 and quantize-then-NCCL")
    qb.add_argument("--layouts", type=ca.layout_list, default="dp4,dp2xtp2",
                    help="comma-separated layouts of --world ranks (default dp4,dp2xtp2)")
    qb.add_argument("--world", type=ca.positive_int, default=4, help="ranks to spawn (default 4)")
    qb.add_argument("--quant", type=ca.quant_list, default="fp8,fp8_block128,nvfp4",
                    help="formats, comma-separated (default fp8,fp8_block128,nvfp4)")
    qb.add_argument("--hidden", type=ca.count_list, default="4096,7168", help="hidden sizes (default 4096,7168)")
    qb.add_argument("--tokens", type=ca.count_list, default="1,2,4,8,16,32,64,128,256,512,1024",
                    help="tokens per DP rank, comma-separated (default 1..1024)")
    qb.add_argument("--counts", choices=QUANT_COUNTS, default="host",
                    help="how our calls get the counts: host (a list, default), device (an int32 tensor of "
                         "all), own (hc.Counts of this DP group's, exchanged in the kernel); NCCL's: host")
    qb.add_argument("--share-gpus", action="store_true",
                    help=share_help + "; quant also keeps hc_bf16 and the Communicator's choice (the bytes floor)")
    qb.add_argument("--out", default=None, help="JSON path (.md and .png written beside it)")
    qb.set_defaults(fn=cmd_bench_quant)

    pdl = bench.add_parser("pdl", help="producer (GEMM, elementwise, ours) -> our op, launched with PDL vs "
                                       "without (GPUs)")
    pdl.add_argument("--world", type=ca.positive_int, default=None,
                     help="ranks to spawn, layout dp<world> (default 4 with 4+ GPUs, else 2)")
    pdl.add_argument("--out", default=None, help="JSON path (.md written beside it)")
    pdl.set_defaults(fn=cmd_bench_pdl)

    layer = bench.add_parser("layer", help="decode steps of the reference MoE decoder per backend")
    layer.add_argument("--layout", type=ca.layout, action="append", default=None,
                       help=layout_help + "; repeat for several of the same world (default dp2xtp2)")
    layer.add_argument("--tokens", type=ca.count_list, default=None,
                       help="tokens per DP rank, comma-separated (default 1,4,16,64,256 on GPUs, 4,16 on CPU)")
    layer.add_argument("--imbalanced", action="store_true", help="also one DP rank with 64 tokens, others 1")
    layer.add_argument("--backends", type=ca.backend_list, default=None,
                       help="comma-separated, the first is the speed-up baseline: auto (hybridcomm), nccl, "
                            "nvlink, reference (default: nccl,auto on GPUs, reference on CPU)")
    layer.add_argument("--device", choices=["cpu", "cuda"], default=None, help=device_help)
    layer.add_argument("--config", choices=["tiny", "bench"], default=None,
                       help="model size (default: bench on GPUs, tiny on CPU)")
    layer.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                       help="default: bfloat16 on GPUs, float32 on CPU")
    layer.add_argument("--quant", type=ca.layer_quant_list, default=None,
                       help="gathers into the MoE, comma-separated, each point runs once per entry: none (16-bit), "
                            "fp8 (fp8 experts fed by the fp8 gather), nvfp4, fp8_block128 (dequantized before "
                            "16-bit experts) (default none)")
    layer.add_argument("--steps", type=ca.positive_int, default=20, help="timed decode steps per point (default 20)")
    layer.add_argument("--out", default=None, help="JSON path (.md written beside it)")
    layer.set_defaults(fn=cmd_bench_layer)

    model = bench.add_parser("model", help="decode steps of a Hugging Face MoE model (hybridcomm.hf) per backend, "
                                           "checked against one device")
    model.add_argument("--config", "--configs", type=_model_configs, default=None,
                       help="hybridcomm.hf.configs names, comma-separated, each run in turn (default: "
                            "qwen3-30b-a3b on GPUs, qwen3_moe-small on CPU), e.g. qwen3-30b-a3b,deepseek-v3")
    model.add_argument("--layers", type=ca.positive_int, default=None,
                       help="override the configs' layers (default: the config's; deepseek-v3 on GPUs: as "
                            "many as one GPU holds with the single-device reference)")
    model.add_argument("--layout", type=ca.layout, action="append", default=None,
                       help=layout_help + "; repeat for several of the same world (default: dp2 on 2-3 GPUs, "
                                          "dp2xtp2 on 4 GPUs or the CPU)")
    model.add_argument("--tokens", type=_model_tokens, default=None,
                       help="tokens per DP group, comma-separated; 64:1 gives one count per DP group, uneven "
                            "16 on the first and 1 on the others (default 1,4,16,64,256,uneven on GPUs, "
                            "4,6:2 on CPU)")
    model.add_argument("--backends", type=ca.backend_list, default=None,
                       help="comma-separated (default: nccl,nccl_symm,auto on GPUs, reference on CPU); "
                            "speed-up is against the best of nccl and nccl_symm")
    model.add_argument("--device", choices=["cpu", "cuda"], default=None, help=device_help)
    model.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                       help="default: bfloat16 on GPUs, float32 on CPU")
    model.add_argument("--steps", type=ca.positive_int, default=8, help="decode steps per point (default 8)")
    model.add_argument("--timeout", type=ca.positive_int, default=900,
                       help="seconds for each config x layout (one worker call; default 900)")
    model.add_argument("--seed", type=int, default=0, help="random weights and prompts (default 0)")
    model.add_argument("--no-check", action="store_true", help="skip the single-device comparison")
    model.add_argument("--eager", action="store_true", help="GPUs: no CUDA graphs (wall-clock step times)")
    model.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                       help="torch.compile the layers' compute regions, as engines fuse them "
                            "(ParallelCausalLM.compile; default: on GPUs); --no-compile runs transformers' "
                            "modules as they are")
    model.add_argument("--out", default=None, help="JSON path (.md written beside it)")
    model.set_defaults(fn=cmd_bench_model)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except ca.UsageError as e:
        return ca.report(" ".join(filter(None, [args.command, getattr(args, "bench", None)])), e)


if __name__ == "__main__":
    sys.exit(main())
