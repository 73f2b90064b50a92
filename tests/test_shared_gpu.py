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
