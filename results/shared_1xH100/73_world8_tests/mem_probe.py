"""Probe: does closing check.communicator's communicators free the workspace with 8 ranks sharing a GPU?"""
import sys
from hybridcomm.spmd import SpmdPool


def probe(collect: bool):
    import torch, torch.distributed as dist
    from hybridcomm import Layout
    from hybridcomm.check import _communicators, communicator
    out = []
    for lay in Layout.all_for_world(8)[:6]:
        a, b = communicator(lay, "auto", "auto"), communicator(lay, "auto", "lamport")
        made = torch.cuda.memory_allocated() >> 20
        for key in [k for k in _communicators if k[0] == lay]:  # (the session's probe called a helper doing this)
            _communicators.pop(key).close()
        closed = torch.cuda.memory_allocated() >> 20
        if collect:
            import gc, time
            gc.collect(); dist.barrier(); torch.cuda.ipc_collect(); time.sleep(0.5); dist.barrier()
            torch.cuda.ipc_collect(); gc.collect()
        import gc
        live = sum(1 for o in gc.get_objects() if type(o).__name__ in ("IpcBuffers", "Workspace"))
        out.append((lay.name, made, closed, torch.cuda.memory_allocated() >> 20, live))
    return out


# Run with this directory on PYTHONPATH (the workers import it):
#   python3 -c "import mem_probe; from hybridcomm.spmd import SpmdPool; p = SpmdPool(8, 'cuda', share_gpus=True);
#               print(p.run(mem_probe.probe, True, timeout=250)[0])"
