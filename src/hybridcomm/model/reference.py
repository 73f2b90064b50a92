"""The single-process reference: the whole model, every DP group, no Communicator.

It runs the very same `decode_step` as the ranks. With every head and expert in one
share nothing is partial, so the transitions only do the residual add + norm and keep
all tokens together; the DP groups' requests are simply concatenated, and so are their
routing offsets, drawn from each group's dp_index (so a group alone gets the same rows
as in the whole batch).
"""

from __future__ import annotations

import torch

from ..norm import add_rms_norm
from .config import ModelConfig
from .decoder import decode_step
from .weights import Batch, DpBatch, ModelWeights, group_route_offsets


class LocalTransitions:
    """One process holds the whole model: sums are complete where they are computed."""

    def gather(self, o, residual, norm_weight, eps):
        return add_rms_norm(o.float(), residual, norm_weight, eps)

    def scatter(self, y):
        return y


def merge_groups(batch: Batch) -> DpBatch:
    """All DP groups' requests as one group (a copy, so the batch's caches stay untouched)."""
    g = batch.groups
    return DpBatch(torch.cat([x.hidden for x in g]), torch.cat([x.k_cache for x in g], dim=1),
                   torch.cat([x.v_cache for x in g], dim=1), torch.cat([x.lengths for x in g]),
                   dp_index=-1)  # not one group's


def reference_forward(cfg: ModelConfig, weights: ModelWeights, batch: Batch) -> list[torch.Tensor]:
    """Final hidden states of one decode step, per DP group (DP order)."""
    if weights.cfg != cfg:
        raise ValueError("reference_forward: weights were generated for a different ModelConfig")
    merged = merge_groups(batch)
    offsets = torch.cat([group_route_offsets(cfg, g.dp_index, g.rows) for g in batch.groups])
    h = decode_step(weights, merged, LocalTransitions(), offsets.to(merged.hidden.device))
    return list(h.split(batch.dp_sizes))
