"""Which step of a Communicator's life makes a CUDA green context stop being current?

On 2x H200 (2026-11-28) tests/test_gpu_sm_budget.py's green-context test failed in
`GreenContext.pop_context()` with NCCL process groups ("expected popped context to be the
current ctx"): something replaced the thread's current context while the calls ran. With
gloo (ranks sharing one GPU) it had passed. Each rank here sets a green context of --sms SMs,
then goes through the steps below, printing after each the thread's current CUcontext (from
libcuda) and how long a bf16 8192^3 matmul and a 1 GiB copy (an elementwise kernel, launched as
ours are) take on torch's current stream and on the green context's own stream: confined to the
green SMs, both take several times longer.

    PYTHONPATH=src python3 scripts/green_context_stages.py --world 2 [--sms 8]
"""

from __future__ import annotations

import argparse
import ctypes

import torch
from green_context_probe import matmul_ms  # (scripts/ is on the path of a script run from it)


def _copy_ms(device, stream=None) -> float:
    """A 1 GiB device-to-device copy, torch's own elementwise kernel launched with <<<>>> as ours
    are launched: on a few SMs it cannot reach HBM's bandwidth."""
    with torch.cuda.stream(stream or torch.cuda.current_stream(device)):
        a = torch.empty(1 << 28, device=device)
        b = torch.empty_like(a)
        b.copy_(a)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _current_context() -> int:
    ctx = ctypes.c_void_p()
    rc = ctypes.CDLL("libcuda.so.1").cuCtxGetCurrent(ctypes.byref(ctx))
    return -rc if rc else (ctx.value or 0)


def _stages(num_sms: int) -> list[str]:
    import torch.distributed as dist
    from torch.cuda import green_contexts

    import hybridcomm as hc

    lines, device = [], torch.device("cuda", torch.cuda.current_device())
    green = green_stream = green_ctx = None

    def note(step: str) -> None:
        ctx = _current_context()
        where = "green" if ctx == green_ctx else ("other" if green_ctx else "-")
        on_green = (f"; on the green stream {matmul_ms(device, green_stream):6.1f} / "
                    f"{_copy_ms(device, green_stream):5.2f} ms") if green_stream else ""
        lines.append(f"  {step:44} context {where:5} matmul / copy {matmul_ms(device):6.1f} / "
                     f"{_copy_ms(device):5.2f} ms{on_green}")

    note("start (NCCL default group initialised)")
    green = green_contexts.GreenContext.create(num_sms=num_sms, device_id=torch.cuda.current_device())
    green.set_context()
    green_ctx = _current_context()
    green_stream = green.Stream()
    note("green.set_context()")
    world = dist.get_world_size()
    group = dist.new_group(list(range(world)))
    note("dist.new_group (eager NCCL init)")
    dist.all_reduce(torch.ones(4, device="cuda"), group=group)
    note("dist.all_reduce on it")
    comm = hc.Communicator(hc.Layout(world), max_sms=num_sms)
    note("hc.Communicator(...)")
    x = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    comm.all_reduce(x)
    torch.cuda.synchronize()
    note("comm.all_reduce (our kernel)")
    comm.close()
    if _current_context() == green_ctx:
        green.pop_context()
        lines.append("  popped the green context")
    else:
        lines.append("  the green context is no longer current: not popped")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--sms", type=int, default=8)
    args = p.parse_args()
    from hybridcomm.spmd import SpmdPool

    with SpmdPool(args.world, "cuda") as pool:
        per_rank = pool.run(_stages, args.sms, timeout=300)
    for rank, lines in enumerate(per_rank):
        print(f"-- rank {rank}")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
