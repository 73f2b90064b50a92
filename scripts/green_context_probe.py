"""Do our kernels finish when a rank may use fewer SMs than its GPU has?

Our kernels size their grids to the GPU's SM count (at most one block per SM) and assume every
block can be resident at once: a block may wait for a peer's block, and the peer's for one of
ours. An engine that gives communication a share of the SMs (a CUDA green context, MPS with an
active-thread limit) breaks that assumption. Each rank here runs inside a green context of
--sms SMs (torch.cuda.green_contexts) and makes calls whose grids are larger than that, on one
Communicator per layout and table (a fresh one after a failure), and compares every result with
the reference backend's, bit for bit.

    PYTHONPATH=src python3 scripts/green_context_probe.py --world 2 --share-gpus --sms 8 [--max-sms 8]
                                                          [--on-stream]

--sms 0: no green context (the control). --max-sms: the Communicator's own cap on its grids.
Prints one line per call: the algorithm that ran, then ok, a mismatch, or the error raised.
"""

from __future__ import annotations

import argparse
import time

import torch

HIDDEN = 4096
ROWS = 256  # per rank: 2 MiB of bf16 rows, far more blocks' worth of work than --sms


def _calls(layout, rank: int, device) -> dict:
    """name -> function of a communicator: calls whose grids would fill the GPU (ROWS rows of
    HIDDEN per DP group, or as many elements), random inputs, the same on every communicator."""
    g = torch.Generator(device="cpu").manual_seed(rank)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device, torch.bfloat16)

    world, dp = layout.world_size, layout.attn_dp
    flat, rows, all_rows = randn(ROWS * HIDDEN), randn(ROWS, HIDDEN), randn(ROWS * world, HIDDEN)
    dp_rows, moe_rows = randn(ROWS, HIDDEN), randn(ROWS * dp, HIDDEN)
    return {
        "all_reduce": lambda c: c.all_reduce(flat),
        "all_gather_v": lambda c: c.all_gather_v(rows, [ROWS] * world),
        "reduce_scatter_v": lambda c: c.reduce_scatter_v(all_rows, [ROWS] * world),
        "gather_tokens": lambda c: c.gather_tokens(dp_rows, [ROWS] * dp),
        "scatter_tokens": lambda c: c.scatter_tokens(moe_rows, [ROWS] * dp),
        "gather_tokens fp8": lambda c: c.gather_tokens(dp_rows, [ROWS] * dp, quant="fp8").data.view(torch.uint8),
    }


def matmul_ms(device, stream=None) -> float:
    """A compute-bound kernel's time on `stream` (default: the current one): it scales with the
    SMs the context gives (scripts/green_context_stages.py uses it too)."""
    with torch.cuda.stream(stream or torch.cuda.current_stream(device)):
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        a @ a
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ a
        end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _difference(got: torch.Tensor, expected: torch.Tensor) -> str:
    if got.shape != expected.shape:
        return f"shape {tuple(got.shape)} vs {tuple(expected.shape)}"
    rows = (got != expected).reshape(got.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
    return f"{len(rows)} of {got.shape[0]} rows differ, first {rows[:6]}"


def _run(comm_for, calls: dict, expected: dict) -> list[str]:
    """Each call on comm_for()'s communicator (a fresh one after a failure: it breaks them);
    after a wrong result the same call once more, to see whether that one raises."""
    lines, comm = [], None
    for name, call in calls.items():
        comm = comm or comm_for()
        for attempt in ("", " (again)"):
            start = time.perf_counter()
            try:
                got = call(comm)
                comm.check_errors()
                ms = (time.perf_counter() - start) * 1e3
                choice = f"{comm.last_choice.backend}/{comm.last_choice.algorithm}"
                same = torch.equal(got, expected[name])
                verdict = "ok" if same else "MISMATCH, " + _difference(got, expected[name])
                lines.append(f"  {name + attempt:26} {choice}: {verdict} ({ms:.0f} ms)")
                if same:
                    break
            except Exception as e:  # noqa: BLE001 -- the probe reports whatever happened
                ms = (time.perf_counter() - start) * 1e3
                lines.append(f"  {name + attempt:26} raised {type(e).__name__} after {ms:.0f} ms: {str(e)[:110]}")
                comm.close()
                comm = None
                break
    if comm:
        comm.close()
    return lines


def _probe(num_sms: int, max_sms: int | None, timeout_s: float, tables: list[str],
           attn_tps: list[int], on_stream: bool = False) -> list[str]:
    import torch.distributed as dist

    import hybridcomm as hc
    from torch.cuda import green_contexts

    device = torch.device("cuda", torch.cuda.current_device())
    lines = [f"green contexts supported: {green_contexts.SUPPORTED}; the GPU has "
             f"{torch.cuda.get_device_properties(device).multi_processor_count} SMs; "
             f"a bf16 8192^3 matmul takes {matmul_ms(device):.1f} ms"]
    world = dist.get_world_size()
    cases = []  # (layout, calls, their results on the reference backend, outside any green context)
    for layout in [hc.Layout(world, attn_tp=t) for t in attn_tps]:
        calls = _calls(layout, dist.get_rank(), device)
        reference = hc.Communicator(layout, device=device, backend="reference")
        cases.append((layout, calls, {name: call(reference) for name, call in calls.items()}))
    stream = None  # the calls' stream: torch's current one, or with on_stream the green context's
    if num_sms:  # kept referenced: the context is destroyed with the object
        green = green_contexts.GreenContext.create(num_sms=num_sms, device_id=device.index)
        if on_stream:
            stream = green.Stream()
        else:
            green.set_context()
        lines.append(f"in a green context of {num_sms} SMs{' (its stream)' if on_stream else ''}: "
                     f"multi_processor_count {torch.cuda.get_device_properties(device).multi_processor_count}, "
                     f"the matmul {matmul_ms(device, stream):.1f} ms")
    options = {} if max_sms is None else {"max_sms": max_sms}
    with torch.cuda.stream(stream or torch.cuda.current_stream(device)):
        for layout, calls, expected in cases:
            lines.append(f"{layout.name}, the reference backend:")  # also in the green context
            lines += _run(lambda: hc.Communicator(layout, device=device, backend="reference"), calls, expected)
            for table in tables:
                lines.append(f"{layout.name}, table {table}:")
                lines += _run(lambda: hc.Communicator(layout, device=device, timeout_s=timeout_s, table=table,
                                                      **options), calls, expected)
        if num_sms and on_stream:
            lines.append(f"the matmul on the green stream after the calls: {matmul_ms(device, stream):.1f} ms")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--share-gpus", action="store_true", help="ranks share GPUs (one GPU machines)")
    p.add_argument("--sms", type=int, default=8, help="SMs of each rank's green context (0: none)")
    p.add_argument("--max-sms", type=int, default=None, help="Communicator(max_sms=...)")
    p.add_argument("--timeout-s", type=float, default=5.0)
    p.add_argument("--tables", default="auto,two_shot,bulk,quant_one_hop,quant_local,pipelined",
                   help="named tables (algorithms.NAMED_TABLES) to run the calls with")
    p.add_argument("--attn-tp", default=None, help="layouts by attention TP, e.g. 1,2 (default: 1 and the world)")
    p.add_argument("--on-stream", action="store_true",
                   help="make the calls on the green context's stream instead of making the context current "
                        "(with NCCL process groups the current context does not stay: green_context_stages.py)")
    args = p.parse_args()
    from hybridcomm.spmd import SpmdPool

    with SpmdPool(args.world, "cuda", share_gpus=args.share_gpus) as pool:
        attn_tps = [int(t) for t in args.attn_tp.split(",")] if args.attn_tp else [1, args.world]
        per_rank = pool.run(_probe, args.sms, args.max_sms, args.timeout_s, args.tables.split(","), attn_tps,
                            args.on_stream, timeout=400)
    for rank, lines in enumerate(per_rank):
        print(f"-- rank {rank}")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
