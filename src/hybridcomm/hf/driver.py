"""Prefill + greedy decode of one DP group's sequences with a static KV cache.

Sequences live in cache slots 0..slots-1; a decode step advances slots 0..n-1 by one token
(engines keep their running requests packed the same way), n may differ per DP group and
per step, and 0 is allowed.

On CUDA a decode step is one CUDA graph per capacity bucket C (the smallest power of two,
capped at `slots`, that holds the largest DP group's n): inputs are written into the
graph's static buffers, the per-group token counts go in as an int32 device tensor, and the
graph is replayed. The communication moves only the real rows (no padding to the largest
group) and a new mix of counts needs no new capture. Rows n..C-1 are filler: they write
their K/V to a scratch position past the end of every sequence, and their routes skip the
experts. On CPU (or graphs=False) the step runs eagerly with the exact counts.
"""

from __future__ import annotations

import torch

from ..counts import Counts
from .cache import StaticCache
from .model import ParallelCausalLM


def bucket(n: int, slots: int) -> int:
    c = 1
    while c < n:
        c *= 2
    return min(c, slots)


class Decoder:
    def __init__(self, model: ParallelCausalLM, slots: int, max_len: int, graphs: bool | None = None,
                 device_counts: bool | None = None):
        """slots: sequences this DP group holds; max_len: prompt + generated tokens per sequence.
        graphs: capture decode steps (default: on CUDA). device_counts (default: graphs): steps
        run on bucket-sized static buffers with the counts in a device tensor (one graph per
        bucket); False with graphs captures one graph per exact count mix with host counts (what
        a backend without device-side counts needs, e.g. NCCL). device_counts without graphs
        runs the graph path's code eagerly (how the CPU tests check it)."""
        self.model, self.slots, self.max_len = model, slots, max_len
        self.cache = StaticCache(slots, max_len + 1)  # + a scratch position for filler rows
        self.lengths = [0] * slots
        self.graphs = (model.device.type == "cuda") if graphs is None else graphs
        self.device_counts = self.graphs if device_counts is None else device_counts
        self._captured: dict[tuple, tuple] = {}

    @property
    def dp_rank(self) -> int:
        return self.model.comm.layout.coords(self.model.comm.rank).attn_dp_rank

    # -- prefill ------------------------------------------------------------------------------
    def prefill(self, prompts: torch.Tensor) -> torch.Tensor:
        """prompts: (n, P) token ids of this DP group's sequences (n may be 0; P the same on all
        ranks). Exchanges the counts itself. Returns logits (n, P, vocab)."""
        n, p = prompts.shape
        if n > self.slots or p > self.max_len:
            raise ValueError(f"prompts: {n} x {p} does not fit {self.slots} slots x {self.max_len} positions")
        positions = torch.arange(p, device=prompts.device).expand(n, p)
        logits = self.model(prompts.to(self.model.device), positions.to(self.model.device), self.cache,
                            Counts(n * p))
        self.lengths[:n] = [p] * n
        return logits

    # -- decode -------------------------------------------------------------------------------
    def step(self, tokens: torch.Tensor, dp_counts: list[int] | None = None) -> torch.Tensor:
        """tokens: (n,) next tokens of slots 0..n-1. dp_counts: every DP group's n this step
        (needed for graphs; eager steps exchange the counts when it is None). Returns (n, vocab)."""
        n = tokens.shape[0]
        if any(self.lengths[s] >= self.max_len for s in range(n)):
            raise ValueError(f"step: a sequence reached max_len={self.max_len}")
        if dp_counts is not None and dp_counts[self.dp_rank] != n:
            raise ValueError(f"dp_counts[{self.dp_rank}] = {dp_counts[self.dp_rank]} but {n} tokens given")
        positions = torch.tensor(self.lengths[:n], dtype=torch.long)
        if self.graphs or self.device_counts:
            if dp_counts is None:
                raise ValueError("dp_counts: graph / device-count steps need every DP group's count")
            logits = self._static_step(tokens, positions, dp_counts)
        else:
            sizes = Counts(n) if dp_counts is None else list(dp_counts)
            logits = self.model(tokens.to(self.model.device)[:, None], positions.to(self.model.device)[:, None],
                                self.cache, sizes)[:, 0]
        for s in range(n):
            self.lengths[s] += 1
        return logits

    def graph_key(self, dp_counts) -> tuple:
        if self.device_counts:
            return "device", bucket(max(dp_counts), self.slots)
        return "host", tuple(dp_counts)

    def graph(self, dp_counts) -> torch.cuda.CUDAGraph:
        """The captured step that runs `dp_counts` (after a step with them)."""
        return self._captured[self.graph_key(dp_counts)][0]

    def replay_us(self, dp_counts, replays: int) -> float:
        """µs per replay of the captured step for `dp_counts` (timed with CUDA events; each
        replay rewrites the same cache positions, so the cache stays valid)."""
        from ..bench.timing import replay_us

        return replay_us(self.graph(dp_counts), replays)

    def _static_step(self, tokens, positions, dp_counts):
        n = tokens.shape[0]
        key = self.graph_key(dp_counts)
        if key not in self._captured:
            rows = key[1] if self.device_counts else n
            self._captured[key] = self._prepare(rows, None if self.device_counts else list(dp_counts))
        graph, ids, pos, counts, out, run = self._captured[key]
        ids.zero_()
        pos.fill_(self.max_len)  # filler rows: the scratch position
        ids[:n, 0].copy_(tokens, non_blocking=True)
        pos[:n, 0].copy_(positions, non_blocking=True)
        if counts is not None:
            counts.copy_(torch.tensor(dp_counts, dtype=torch.int32), non_blocking=True)
        if graph is not None:
            graph.replay()
        else:
            out = run()
        return out[:n, 0]

    def _prepare(self, rows: int, host_counts):
        """Static inputs for `rows` rows, and the step captured on them (graphs) or not."""
        device = self.model.device
        ids = torch.zeros((rows, 1), dtype=torch.long, device=device)
        pos = torch.full((rows, 1), self.max_len, dtype=torch.long, device=device)
        counts = None
        if host_counts is None:
            counts = torch.full((self.model.comm.layout.attn_dp,), rows, dtype=torch.int32, device=device)
        sizes = counts if counts is not None else host_counts
        run = lambda: self.model(ids, pos, self.cache, sizes)  # noqa: E731
        if not self.graphs:
            return None, ids, pos, counts, None, run
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        # The first capture runs the step twice: a rank whose DP group had no prompts allocates its
        # cache only in the first run, and the second takes the capture's path (compiled regions
        # compile there). Every rank runs it as often as the others (each run is a sequence of
        # collectives), so this depends on what all ranks share, never on this rank's cache.
        first = not self._captured
        with torch.cuda.stream(side):  # lazy setup (NCCL, allocator, kernels' first launch) outside capture
            run()
            if first:
                run()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        return graph, ids, pos, counts, out, run
