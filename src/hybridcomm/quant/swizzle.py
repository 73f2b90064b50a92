"""The 128x4 swizzled scale layout that CUTLASS (and TensorRT-LLM / FlashInfer) fp4 GEMMs read.

Scales of a (rows, cols) matrix are padded to (round_up(rows, 128), round_up(cols, 4)) with
zeros and stored in tiles of 128 rows x 4 columns, 512 bytes each, tiles in row-major order
(row tile, then column tile). Inside a tile, the scale of row r and column c (tile-local)
sits at byte (r % 32) * 16 + (r // 32) * 4 + c.

The tiles span 128 rows, so with uneven counts per rank they cannot be assembled from
per-rank pieces: swizzle after the gather, on the valid rows.
"""

from __future__ import annotations

import torch

TILE_ROWS, TILE_COLS = 128, 4


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def swizzle_128x4(scales: torch.Tensor) -> torch.Tensor:
    """(rows, cols) scales -> (round_up(rows, 128), round_up(cols, 4)) whose memory is in the
    swizzled order (same dtype; padding is zero)."""
    rows, cols = scales.shape
    prow, pcol = _round_up(rows, TILE_ROWS), _round_up(cols, TILE_COLS)
    padded = scales.new_zeros((prow, pcol))
    padded[:rows, :cols] = scales
    # row = tile * 128 + r4 * 32 + r32; col = ctile * 4 + c4 -> order (tile, ctile, r32, r4, c4)
    tiles = padded.view(prow // TILE_ROWS, 4, 32, pcol // TILE_COLS, TILE_COLS)
    return tiles.permute(0, 3, 2, 1, 4).contiguous().view(prow, pcol)


def swizzled_offset(row: int, col: int, cols: int) -> int:
    """Byte offset of scale (row, col) in the swizzled layout of a matrix with `cols` columns."""
    col_tiles = _round_up(cols, TILE_COLS) // TILE_COLS
    tile = (row // TILE_ROWS) * col_tiles + col // TILE_COLS
    return tile * 512 + (row % 32) * 16 + (row % TILE_ROWS) // 32 * 4 + col % TILE_COLS
