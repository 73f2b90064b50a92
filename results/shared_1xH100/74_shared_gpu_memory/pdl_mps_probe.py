"""Probe: test_gpu_lamport.py's interleaved graph with PDL, 1000 replays on 8 ranks under MPS,
with every communicator limited to `max_sms` blocks a grid. Without the limit it ended in
PeerTimeout (log 13); if it passes with it, that timeout was the ranks' grids not fitting on one
GPU side by side (docs/architecture.md, "Not MPS"), not the kernels.
Run from the repository root under MPS:
  HYBRIDCOMM_TEST_GPU_RANKS=8 PYTHONPATH=src:tests:results/shared_1xH100/74_shared_gpu_memory \
      python3 -c "import pdl_mps_probe; pdl_mps_probe.main(8)"
(the workers import this module for the worker function)."""

import test_gpu_lamport as lamport_tests


def interleaved_with_max_sms(layout, group, replays, max_sms):
    from hybridcomm import check

    lamport_tests.communicator = lambda lay: check.communicator(lay, max_sms=max_sms)
    result = lamport_tests._interleaved_replays(layout, group, replays, 6, True, 5)
    return result["mismatches"], result["failures"][:3]


def main(max_sms: int) -> None:
    from hybridcomm.spmd import SpmdPool

    pool = SpmdPool(8, "cuda", share_gpus=True)
    for layout, group in lamport_tests._replay_groups():
        per_rank = pool.run(interleaved_with_max_sms, layout, group, 1000, max_sms, timeout=400)
        print(f"{layout.name} {group} pdl max_sms={max_sms}: mismatches per rank {[m for m, _ in per_rank]}"
              f" {per_rank[0][1]}", flush=True)
    pool.close()
