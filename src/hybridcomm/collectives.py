"""torch.distributed's even all-gather / reduce-scatter into one tensor, by the name the running
torch has: 2.13 (the CPU build of development and CI) calls them all_gather_single /
reduce_scatter_single and keeps the old names all_gather_into_tensor / reduce_scatter_tensor
as wrappers that warn (FutureWarning) and cost a Python call more; older torch (2.11 on the GPU
machine) may have the old names only. Same arguments either way."""

from __future__ import annotations

import torch.distributed as dist

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
