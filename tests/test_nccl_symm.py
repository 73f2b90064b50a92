"""The nccl_symm backend's own logic on CPU: its registered arena replaced by plain buffers
(registration needs NCCL), its collectives run on gloo, which takes equal counts only. The
token transitions must equal the reference's, results must live in the ring of slots, and
the arena must grow for a larger transition. NCCL's symmetric kernels themselves are tested
on GPUs (test_gpu.py, test_hf_gpu.py)."""

import pytest
import torch

import hybridcomm as hc
from hybridcomm.arguments import parse_sizes
from hybridcomm.norm import ResidualNorm

LAYOUTS = [(1, 1), (2, 1), (4, 1), (2, 2)]  # (attn_tp, moe_tp) on world 4: dp4, dp2xtp2, tp4, dp2xtp2 moe_tp2


def _plain_buffers(nbytes, device, process_groups):
    return None, [torch.empty(n, dtype=torch.uint8, device=device) for n in nbytes], None


def _transitions(attn_tp: int, moe_tp: int) -> dict:
    import hybridcomm.backends.nccl_symm as nccl_symm

    nccl_symm.register_buffers = _plain_buffers
    layout = hc.Layout(4, attn_tp=attn_tp, moe_tp=moe_tp)
    comm = hc.Communicator(layout, device="cpu")
    backend = nccl_symm.NcclSymmBackend(comm.groups, comm.device)
    coords = layout.coords(comm.rank)
    counts = [2 * attn_tp] * layout.attn_dp  # equal and divisible by attn_tp: what gloo takes
    sizes = parse_sizes(counts, layout.attn_dp, comm.device, "dp_sizes")
    g = torch.Generator().manual_seed(comm.rank)
    x = torch.randn(counts[coords.attn_dp_rank], 64, generator=g)
    residual = torch.randn(x.shape, generator=torch.Generator().manual_seed(coords.attn_dp_rank))
    weight = torch.randn(64, generator=torch.Generator().manual_seed(99))
    y = torch.randn(sum(counts), 64, generator=g)
    errors = {}
    normed, residual_out = backend.gather_tokens(x, sizes, True, ResidualNorm(residual, weight, 1e-6))
    want_normed, want_residual = comm.gather_tokens(x, counts, residual=residual, norm_weight=weight, eps=1e-6)
    errors["gather_norm"] = (normed - want_normed).abs().max().item()
    errors["gather_norm_residual"] = (residual_out - want_residual).abs().max().item()
    first = normed.clone()
    plain = backend.gather_tokens(x, sizes, True)
    errors["gather"] = (plain - comm.gather_tokens(x, counts)).abs().max().item()
    errors["ring_kept"] = (normed - first).abs().max().item()  # the second call used the other slot
    errors["scatter"] = (backend.scatter_tokens(y, sizes) - comm.scatter_tokens(y, counts)).abs().max().item()
    slot = backend.arenas[-1].slot_bytes
    big = [8192 // layout.attn_dp] * layout.attn_dp  # 8192 rows of 64 fp32: 2 MiB, more than the first arena
    yb = torch.randn(sum(big), 64, generator=g)
    got = backend.scatter_tokens(yb, parse_sizes(big, layout.attn_dp, comm.device, "dp_sizes"))
    errors["scatter_grown"] = (got - comm.scatter_tokens(yb, big)).abs().max().item()
    return {"errors": errors, "grew": backend.arenas[-1].slot_bytes > slot, "slots": len(backend.arenas)}


@pytest.mark.parametrize("layout", LAYOUTS, ids=["dp4", "dp2xtp2", "tp4", "dp2xtp2,moe_tp2"])
def test_nccl_symm_transitions_match_the_reference(pool, layout):
    for r in pool(4).run(_transitions, *layout, timeout=300):
        assert all(e < 1e-5 for e in r["errors"].values()), r
        assert r["grew"] and r["slots"] == 2, r
