"""The eager path skips the custom-op dispatcher (a per-call host cost) unless torch.compile
traces, where the op must stay one opaque node."""

import torch

from hybridcomm import kernels


def test_eager_calls_the_launcher_directly(monkeypatch):
    seen = []
    monkeypatch.setitem(kernels.IMPLS, "all_reduce", lambda *args: seen.append(args) or "direct")
    assert kernels.call("all_reduce", 1, 2, 3) == "direct"
    assert seen == [(1, 2, 3)]


def test_compiling_goes_through_torch_ops(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setitem(kernels.IMPLS, "all_reduce", lambda *args: "direct")
    monkeypatch.setattr(torch.ops.hybridcomm, "all_reduce", lambda *args: ("op", args), raising=False)
    assert kernels.call("all_reduce", 1, 2, 3) == ("op", (1, 2, 3))
