"""The reserved bit pattern: what every op does to input elements whose bits are all ones.

Our Lamport kernels (csrc/lamport.cuh) fill receive buffers with the 32-bit word 0xFFFFFFFF
and treat a word equal to it as "not arrived yet", so no word of data may be 0xFFFFFFFF. Every
op therefore sees its communicated input through `fix_reserved`: an element whose bits are all
ones (fp32 0xFFFFFFFF; fp16 / bf16 0xFFFF -- a negative NaN in each) becomes all ones but the
lowest bit (0xFFFFFFFE / 0xFFFE, still a negative NaN). No number changes, no sign of zero
changes, only the payload of that one NaN. The reference backend and the oracle apply it, and
so do all our kernels, so every backend returns the same bits (NCCL passes the pattern through,
like its other differences it is compared within tolerance). Sums are unaffected in value: a
NaN input gives a NaN sum either way.
"""

from __future__ import annotations

import torch

INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def fix_reserved(x: torch.Tensor) -> torch.Tensor:
    """x with every all-ones element replaced by all-ones-but-the-lowest-bit (see above).
    No host sync, so it also runs inside CUDA graph capture."""
    if not x.is_floating_point():
        return x
    bits = x.view(INT_OF_WIDTH[x.element_size()])  # all ones is -1 as a signed integer
    return torch.where(bits == -1, bits - 1, bits).view(x.dtype)
