"""Runs the code of docs/integration.md on 4 gloo ranks, each snippet against the engine's own
collectives written with torch.distributed (all-reduce over attention TP, all-gather /
reduce-scatter over DP) on the same process groups."""

import re
from pathlib import Path

import torch
import torch.distributed as dist

DOC = Path(__file__).resolve().parents[1] / "docs" / "integration.md"
DP_SIZES = [3, 1]          # tokens per DP rank (DP2 x TP2)
WORLD_SIZES = [2, 0, 3, 1]  # tokens per rank (TensorRT-LLM: every rank its own DP rank)


def doc_namespace() -> dict:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5, "docs/integration.md lost its code blocks"
    namespace: dict = {}
    exec(compile("\n".join(blocks), str(DOC), "exec"), namespace)
    return namespace


def _all_reduce(x, group):
    out = x.clone()
    dist.all_reduce(out, group=group.pg)
    return out


def _rows(x, sizes, index):
    start = sum(sizes[:index])
    return x[start:start + sizes[index]]


def _check_sglang(ns, comm, rank):
    d = comm.layout.coords(rank).attn_dp_rank
    torch.manual_seed(rank)
    partial = torch.randn(DP_SIZES[d], 8)
    reduced = _all_reduce(partial, comm.groups["attn_tp"])  # the engine: all-reduce over attention TP
    gathered = comm.gather_tokens(partial, DP_SIZES)
    assert torch.allclose(_rows(gathered, DP_SIZES, d), reduced, atol=1e-5)
    torch.manual_seed(0)
    w = torch.randn(8, 8)
    moe = lambda t: (t @ w) / comm.layout.world_size  # noqa: E731  (partial: the world's sum is t @ w)
    out = ns["sglang_layer_transitions"](comm, partial, moe, DP_SIZES)
    assert torch.allclose(out, reduced @ w, atol=1e-4)
    residual, norm_w = torch.randn_like(partial), torch.rand(8) + 0.5
    residual = _all_reduce(residual, comm.groups["attn_tp"])  # the same on the DP rank's TP ranks
    normed, residual_out = ns["sglang_prepare_mlp"](comm, partial, residual, norm_w, 1e-6, DP_SIZES)
    assert torch.allclose(residual_out, reduced + residual, atol=1e-5)
    expected = torch.nn.functional.rms_norm(reduced + residual, (8,), norm_w, 1e-6)
    assert torch.allclose(_rows(normed, DP_SIZES, d), expected, atol=1e-5)


def _check_vllm(ns, comm, rank):
    d = comm.layout.coords(rank).attn_dp_rank
    torch.manual_seed(10 + d)  # replicated on the DP rank's TP ranks, as after vLLM's TP all-reduce
    hidden, logits = torch.randn(DP_SIZES[d], 8), torch.randn(DP_SIZES[d], 4)
    h_all, l_all = ns["vllm_dispatch"](comm, hidden, logits, DP_SIZES)
    assert h_all.shape[0] == sum(DP_SIZES)
    assert torch.equal(_rows(h_all, DP_SIZES, d), hidden) and torch.equal(_rows(l_all, DP_SIZES, d), logits)
    y = torch.randn(sum(DP_SIZES), 8)
    combined = ns["vllm_combine"](comm, y, DP_SIZES)
    assert torch.allclose(combined, _rows(_all_reduce(y, comm.groups["attn_dp"]), DP_SIZES, d), atol=1e-5)
    g2, counts = ns["vllm_dispatch_own_count"](comm, hidden)
    assert list(counts.sizes) == DP_SIZES and torch.equal(g2, h_all[:, :8])


def _check_trtllm(ns, comm, rank):
    torch.manual_seed(20 + rank)
    x = torch.randn(WORLD_SIZES[rank], 8)
    assert torch.equal(_rows(ns["trtllm_allgather"](comm, x, WORLD_SIZES), WORLD_SIZES, rank), x)
    y = torch.randn(sum(WORLD_SIZES), 8)
    mine = ns["trtllm_reducescatter"](comm, y, WORLD_SIZES)
    assert torch.allclose(mine, _rows(_all_reduce(y, comm.groups["world"]), WORLD_SIZES, rank), atol=1e-5)


def _run_doc() -> bool:
    ns = doc_namespace()
    world, rank = dist.get_world_size(), dist.get_rank()
    dp2xtp2 = ns["make_communicator"](world, attn_tp=2)
    _check_sglang(ns, dp2xtp2, rank)
    _check_vllm(ns, dp2xtp2, rank)
    _check_trtllm(ns, ns["make_communicator"](world, attn_tp=1), rank)
    return True


def test_integration_doc_snippets(pool):
    assert all(pool(4).run(_run_doc))
