"""The eager benchmark's plumbing (bench/eager.py, scripts/eager_profile.py) runs end to end
without GPUs: the GPU route of bench/host.py (fake process group, meta tensors, no-op C
launchers) with CUDA synchronisation a no-op. It checks what is measured (every op, ours and
theirs, wall and issue, our calls on our kernels, theirs by layout), not how fast anything is.
"""

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import hybridcomm as hc
from hybridcomm import collectives
from hybridcomm.bench import eager, timing
from hybridcomm.bench.host import gpu_route_communicator

OPS = ["all_reduce", "all_gather_v", "reduce_scatter_v", "gather_tokens", "gather_tokens+norm", "scatter_tokens"]


@pytest.fixture
def no_cuda_sync(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


@pytest.mark.parametrize("attn_tp", [1, 2])
def test_eager_table_measures_every_op_both_ways(stub_lib, no_cuda_sync, attn_tp):
    comm = gpu_route_communicator(hc.Layout(2, attn_tp=attn_tp), stub_lib)
    table = eager.eager_table(comm, rounds=3, calls=5, issue_calls=3)
    assert list(table) == OPS
    for op, t in table.items():
        assert sorted(t) == ["ours_issue", "ours_wall", "theirs_issue", "theirs_wall"], op
        assert all(v > 0 for v in t.values()), (op, t)
    costs = eager.eager_costs(comm)
    assert {f"issue_hybridcomm_{op}" for op in OPS} <= set(costs)
    assert "| gather_tokens+norm |" in eager.format_table(table, "t")


def test_our_calls_run_our_kernels_and_theirs_follow_the_layout(stub_lib, monkeypatch):
    seen = []
    for module, name in ((dist, "all_reduce"), (collectives, "all_gather_single"),
                         (collectives, "reduce_scatter_single"), (eager, "engine_add_rms_norm")):
        monkeypatch.setattr(module, name, lambda *a, _name=name, **k: seen.append((_name, k.get("group"))))
    for attn_tp, gather, fused, scatter in (
            (1, ["all_gather_single"], ["engine_add_rms_norm", "all_gather_single"], ["reduce_scatter_single"]),
            (2, ["all_reduce"], ["all_reduce", "engine_add_rms_norm"], ["all_reduce"])):
        comm = gpu_route_communicator(hc.Layout(2, attn_tp=attn_tp), stub_lib)
        expected = {"gather_tokens": gather, "gather_tokens+norm": fused, "scatter_tokens": scatter}
        for op, (ours, theirs) in eager.eager_calls(comm).items():
            ours()
            assert comm.last_choice.backend == "nvlink", (attn_tp, op, comm.last_choice)
            seen.clear()
            theirs()
            if op in expected:
                assert [n for n, _ in seen] == expected[op], (attn_tp, op, seen)


def test_eager_profile_script_prints_the_table(stub_lib, no_cuda_sync, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import eager_profile
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(timing, "max_over_ranks", lambda values: values)
    monkeypatch.setattr(timing, "environment", lambda: {})
    monkeypatch.setattr(hc, "Communicator", lambda layout: gpu_route_communicator(layout, stub_lib))
    result = eager_profile._profile(2, 2, 2, 5, 3, True, True)
    assert result["layout"] == "tp2" and list(result["table"]) == OPS
    assert "Eager cost, tp2" in result["report"]
    for op in OPS:
        assert f"## {op}: cProfile" in result["report"] and f"## torch.distributed {op}: cProfile" in result["report"]
