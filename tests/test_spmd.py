"""The worker pool carries a rank's error to the caller intact, and a result it cannot load ends
the pool instead of leaking into the next call (a PeerTimeout once could not be unpickled, and
every later test of that session read the broken queue)."""

import os
import pickle
from pathlib import Path

import pytest

from hybridcomm.errors import ArgumentMismatch, PeerTimeout
from hybridcomm.spmd import SpmdPool

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("error", [
    PeerTimeout("all_reduce", "world", 3, 10.0),
    PeerTimeout("gather_tokens", "attn_tp", (1, 2), 2.5),
    ArgumentMismatch.on_device("scatter_tokens", "dp", 1, "dtype"),
])
def test_our_errors_survive_pickling_with_message_and_attributes(error):
    loaded = pickle.loads(pickle.dumps(error))
    assert type(loaded) is type(error) and str(loaded) == str(error)
    assert loaded.__dict__ == error.__dict__


def _peer_timeout_on(rank_that_raises):
    import torch.distributed as dist
    if dist.get_rank() == rank_that_raises:
        raise PeerTimeout("all_reduce", "world", 0, 10.0)
    return dist.get_rank()


def _fail_to_load():
    raise RuntimeError("this result cannot be loaded")


class _Unloadable:
    def __reduce__(self):
        return _fail_to_load, ()


def _unloadable_on(rank_that_returns_it):
    import torch.distributed as dist
    return _Unloadable() if dist.get_rank() == rank_that_returns_it else dist.get_rank()


def test_a_peer_timeout_raised_by_a_rank_reaches_the_caller_and_the_pool_goes_on(pool):
    with pytest.raises(PeerTimeout) as raised:
        pool(2).run(_peer_timeout_on, 1, timeout=60)
    assert (raised.value.group, raised.value.peer, raised.value.timeout_s) == ("world", 0, 10.0)
    assert pool(2).run(_peer_timeout_on, -1, timeout=60) == [0, 1]


def test_a_result_that_cannot_be_loaded_kills_the_pool_so_no_later_call_reads_it():
    with SpmdPool(2) as spmd:
        with pytest.raises(RuntimeError, match="_unloadable_on: a worker's result could not be loaded"):
            spmd.run(_unloadable_on, 1, timeout=60)
        assert not spmd.alive


_INNER_TESTS = '''
import os
pids = []
def _pid():
    return os.getpid()
def test_a_fails(pool):
    pids.append(pool(2).run(_pid))
    assert False
def test_b_gets_fresh_workers(pool):
    assert pool(2).run(_pid) != pids[0]
def test_c(pool):
    pids.append(pool(2).run(_pid))
def test_d_keeps_them_while_tests_pass(pool):
    assert pool(2).run(_pid) == pids[1]
'''


def test_after_a_failed_test_the_next_one_gets_fresh_workers(pytester, monkeypatch):
    # (their communicators may be broken: tests/conftest.py's pytest_runtest_makereport)
    src = Path(__file__).resolve().parent.parent / "src"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])))
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_inner=_INNER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=1)
