"""Run prefill + greedy decode steps and compare every logit with the unmodified
single-device model.

A schedule is a list of decode steps, each with every DP group's number of sequences that
advance (slots 0..n-1 of that group; 0 is allowed). The reference sees each sequence as
prompt + the tokens it was fed and returns logits for all its positions in one forward,
so paused sequences and uneven groups need no special handling.
"""

from __future__ import annotations

import torch

from .driver import Decoder


def dp_prompts(vocab: int, counts: list[int], length: int, dp: int, seed: int = 0) -> torch.Tensor:
    """This DP group's prompts: (counts[dp], length) token ids, the same on its TP ranks."""
    g = torch.Generator().manual_seed(seed * 1000 + dp)
    return torch.randint(0, vocab, (counts[dp], length), generator=g)


def pause_schedule(counts: list[int], steps: int) -> list[list[int]]:
    """All sequences advance, except that on every other step DP group (step % groups) pauses
    (no tokens) and the others advance one sequence fewer: uneven and empty groups both occur."""
    schedule = []
    for s in range(steps):
        if s % 2 == 0:
            schedule.append(list(counts))
        else:
            schedule.append([0 if d == (s // 2) % len(counts) else max(c - 1, 0) for d, c in enumerate(counts)])
    return schedule


def decode(decoder: Decoder, prompts: torch.Tensor, schedule: list[list[int]], on_step=None):
    """Greedy decode of this DP group's sequences. Returns (fed, logits): per sequence, the
    tokens fed after the prompt, and its logits (prompt positions + one row per step), on CPU
    in the model's dtype. on_step(step_index) is called after every step (progress, timing)."""
    dp = decoder.dp_rank
    prefill = decoder.prefill(prompts).cpu()
    logits = [[row] for row in prefill]
    fed = [[] for _ in range(prompts.shape[0])]
    nxt = [row[-1].argmax().item() for row in prefill]
    for i, counts in enumerate(schedule):
        n = counts[dp]
        tokens = torch.tensor(nxt[:n], dtype=torch.long)
        out = decoder.step(tokens, counts).cpu()
        for s in range(n):
            fed[s].append(nxt[s])
            logits[s].append(out[s][None])
            nxt[s] = out[s].argmax().item()
        if on_step is not None:
            on_step(i)
    return fed, [torch.cat(rows) for rows in logits]


BATCH = 16  # reference sequences per forward


@torch.no_grad()
def reference_logits(reference, prompts: torch.Tensor, fed):
    """Yields the reference's logits (positions x vocab, float on CPU) of every sequence in
    order; sequences of equal length run together, BATCH at a time (no padding needed)."""
    device = next(reference.parameters()).device
    seqs = [torch.cat([prompt, torch.tensor(tokens, dtype=torch.long)]) for prompt, tokens in zip(prompts, fed)]
    start = 0
    while start < len(seqs):
        end = start + 1
        while end < len(seqs) and end - start < BATCH and len(seqs[end]) == len(seqs[start]):
            end += 1
        yield from reference(torch.stack(seqs[start:end]).to(device)).logits.float().cpu()
        start = end


def compare(reference, prompts: torch.Tensor, fed, logits, top1=None) -> dict:
    """max relative error (max |ours - ref| / max |ref| per sequence, max over sequences) and
    top-1 agreement over all positions, against `reference` (a transformers causal LM).
    logits[i] may be None for a sequence whose logits were not kept: then top1[i] (its
    argmax per position) counts for the agreement only."""
    worst, agree, total, nonfinite = 0.0, 0, 0, 0
    for i, ref in enumerate(reference_logits(reference, prompts, fed)):
        ours = logits[i]
        if ours is not None:
            ours = ours.float()
            # NaN / inf (a row nobody wrote) must fail the check, not vanish in max()
            error = torch.nan_to_num((ours - ref).abs(), nan=float("inf")).max()
            worst = max(worst, (error / ref.abs().max().clamp_min(1e-30)).item())
            nonfinite += (~torch.isfinite(ours).all(-1)).sum().item()
        ids = ours.argmax(-1) if ours is not None else top1[i]
        agree += (ids == ref.argmax(-1)).sum().item()
        total += ref.shape[0]
    return {"max_rel_error": worst, "top1_agreement": agree / total if total else 1.0, "positions": total,
            "nonfinite_positions": nonfinite}
