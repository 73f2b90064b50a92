"""Ranks sharing a GPU (src/hybridcomm/shared_gpu.py), what a CPU can check of it: with no
NCCL process group the calls the table gives NCCL run on the reference backend, ours stay ours;
the command line shares GPUs only with --device cuda. The kernels themselves run on a GPU:
`pytest --gpu-ranks 2` there (scripts/gpu_check.sh does it with one GPU)."""

import pytest
import torch

import hybridcomm as hc
from hybridcomm import cli_args
from hybridcomm.bench.host import gpu_route_communicator
from hybridcomm.communicator import has_nccl


def test_without_nccl_the_tables_nccl_sizes_run_on_the_reference(stub_lib):
    assert not has_nccl()  # the fake process group, as gloo would be
    comm = gpu_route_communicator(hc.Layout(2), stub_lib)
    world = comm.groups["world"]
    small = torch.empty(1024, dtype=torch.bfloat16, device="meta")
    huge = torch.empty(64 << 20, dtype=torch.bfloat16, device="meta")  # 128 MB: beyond every nvlink rule
    assert comm._select("all_reduce", world, small)[1] == "one_shot"
    backend, algorithm = comm._select("all_reduce", world, huge)
    assert (backend, algorithm) == (comm.backends["reference"], None)
    assert comm.last_choice.reason.startswith("no NCCL process group")


def test_the_command_line_shares_gpus_only_on_cuda():
    with pytest.raises(cli_args.UsageError, match="--share-gpus needs --device cuda"):
        cli_args.check_device("cpu", 2, share_gpus=True)
    if not torch.cuda.is_available():
        with pytest.raises(cli_args.UsageError, match="no CUDA GPU"):
            cli_args.check_device("cuda", 2, share_gpus=True)


# -- bench --share-gpus (bench/shared.py): our kernels only, the note in every table ---------------

def test_a_shared_bench_makes_no_baseline_buffers():
    from hybridcomm.bench.baselines import baseline_buffers

    # No process group exists here: making real buffers would raise, the absent ones must not try.
    symm, sm = baseline_buffers([1 << 20], 1 << 20, torch.device("cpu"), share_gpus=True)
    assert symm.buffers is None and sm.buffer is None
    assert "share a GPU" in symm.error and "share a GPU" in sm.error


def test_a_shared_bench_times_only_our_forced_algorithms():
    from hybridcomm.bench.shared import ours_only

    calls = dict.fromkeys(["nccl", "nccl_symm", "hybridcomm", "hc_one_shot", "hc_two_shot", "hc_norm"])
    assert sorted(ours_only(calls, {"hc_one_shot": 0, "hc_two_shot": 0, "hc_bulk": 0})) == ["hc_one_shot",
                                                                                         "hc_two_shot"]
    # bench quant keeps its default Communicator's calls too (the bytes floor reads them).
    assert sorted(ours_only(calls, {"hc_norm": 0}, also=("hybridcomm", "hc_bf16"))) == ["hc_norm", "hybridcomm"]


def test_a_shared_bench_keeps_default_calls_only_where_the_table_picks_our_kernels():
    from types import SimpleNamespace

    from hybridcomm.bench.shared import on_nvlink

    comm, made = SimpleNamespace(last_choice=None), []

    def call(name, backend):
        def make():
            made.append(name)
            comm.last_choice = SimpleNamespace(backend=backend)
        return make

    calls = {"hc_bf16": call("hc_bf16", "reference"), "hybridcomm": call("hybridcomm", "nvlink"),
             "nccl": call("nccl", "nccl")}
    assert on_nvlink(calls, comm, ("hc_bf16", "hybridcomm")) == ("hybridcomm",)
    assert made == ["hc_bf16", "hybridcomm"]  # each asked once, the others not made


@pytest.mark.parametrize("kind", ["ops", "transitions", "quant"])
def test_a_shared_runs_tables_say_so(kind):
    from hybridcomm.bench import report
    from hybridcomm.bench.quant import quant_markdown

    record = {"ops": {"op": "all_reduce", "bytes": 2048},
              "transitions": {"layout": "dp2", "op": "gather_tokens", "case": "balanced", "tokens_per_dp": [1, 1]},
              "quant": {"layout": "dp2", "format": "fp8", "hidden": 4096, "case": "balanced",
                        "tokens_per_dp": [1, 1]}}[kind]
    results = {"environment": {"gpu": "test"}, "world_size": 2, "dtype": "torch.bfloat16", "hidden": 4096,
               "records": [{**record, "impl": "hc_one_shot", "us": 5.0}],
               "shared_gpu": {"note": "ranks shared one GPU", "max_sms": 66, "mps": True}}
    markdown = {"ops": report.ops_markdown, "transitions": report.transitions_markdown, "quant": quant_markdown}[kind]
    text = markdown(results)
    assert "shared_gpu: " in text and "ranks shared one GPU" in text
    assert "shared_gpu" not in markdown({k: v for k, v in results.items() if k != "shared_gpu"})


def test_the_benches_share_gpus_only_on_cuda(capsys):
    from hybridcomm import cli

    assert cli.main(["bench", "ops", "--device", "cpu", "--world", "2", "--share-gpus"]) == 2
    assert "--share-gpus needs --device cuda" in capsys.readouterr().err


def test_mps_is_seen_from_its_control_pipe(tmp_path, monkeypatch):
    from hybridcomm.bench.shared import mps_running

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not mps_running()
    (tmp_path / "control").touch()  # what `nvidia-cuda-mps-control -d` makes there
    assert mps_running()


# -- the communicators a test worker keeps (check.communicator) ---------------------------------------

def test_a_worker_keeps_its_most_recently_used_gpu_communicators(monkeypatch):
    from types import SimpleNamespace

    from hybridcomm import check

    closed = []
    def made(i, device):  # a stand-in: what communicator() reads of a Communicator
        return SimpleNamespace(device=torch.device(device), close=lambda: closed.append(i))
    keys = [(hc.Layout(2), "auto", f"table{i}", False, None) for i in range(check.KEPT_ON_GPU + 2)]
    kept = {k: made(i, "cuda") for i, k in enumerate(keys[:-1])}
    kept[keys[-1]] = made(len(keys) - 1, "cpu")  # holds no GPU memory: never closed for room
    monkeypatch.setattr(check, "_communicators", dict(kept))
    assert check.communicator(*keys[0]) is kept[keys[0]]  # used again: now the most recent, no new one
    assert closed == [1]  # 9 on the GPU: the least recently used goes
    assert list(check._communicators) == keys[2:] + keys[:1]
