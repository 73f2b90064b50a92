"""A static KV cache in the shape transformers' attention modules expect of a `Cache`.

One buffer per layer and tensor, (slots, heads, positions, dim), allocated on the first
write (its heads and dim are whatever the attention stores: per-head K/V for GQA, the
compressed latent for DeepSeek's MLA). A forward covers the sequences in slots 0..n-1 and
writes position `positions[b, t]` of slot b; the attention reads all positions of those
slots and the mask hides the unwritten ones. Shapes never depend on data, so a decode step
can be captured in a CUDA graph and replayed with new positions.
"""

from __future__ import annotations

import torch


class StaticCache:
    def __init__(self, slots: int, positions: int):
        self.slots, self.positions = slots, positions
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._rows = self._where = None

    def bind(self, positions: torch.Tensor) -> None:
        """positions: (n, q) long: where the next forward's q tokens of slots 0..n-1 go."""
        n = positions.shape[0]
        if n > self.slots:
            raise ValueError(f"positions: {n} sequences, the cache has {self.slots} slots")
        self._rows = torch.arange(n, device=positions.device)[:, None].expand_as(positions)
        self._where = positions

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key, value: (n, heads, q, dim). Returns the whole cache of slots 0..n-1."""
        if layer_idx not in self.buffers:
            self.buffers[layer_idx] = tuple(
                torch.zeros((self.slots, t.shape[1], self.positions, t.shape[3]), dtype=t.dtype, device=t.device)
                for t in (key, value))
        n = key.shape[0]
        out = []
        for buffer, new in zip(self.buffers[layer_idx], (key, value)):
            # advanced indices around a slice: the indexed dims lead, (n, q, heads, dim)
            buffer[self._rows, :, self._where] = new.transpose(1, 2)
            out.append(buffer[:n])
        return out[0], out[1]
