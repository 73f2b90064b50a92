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
    """`logits` against `reference` (a transformers causal LM) on the same sequences: see
    compare_logits."""
    return compare_logits(reference_logits(reference, prompts, fed), logits, top1)


def compare_logits(references, logits, top1=None) -> dict:
    """max relative error (max |ours - ref| / max |ref| per sequence, max over sequences), the
    median over positions of the same per position, and top-1 agreement over all positions,
    of `logits` against `references` (one logits tensor per sequence, in order).
    logits[i] may be None for a sequence whose logits were not kept: then top1[i] (its
    argmax per position) counts for the agreement only.

    The max is set by the worst position: in 16-bit one router near-tie that rounds the other
    way gives a token other experts and moves its logits far (DeepSeek-V3: see the noise floor
    below); the median shows the rounding of the positions that routed alike."""
    worst, agree, total, nonfinite, per_position = 0.0, 0, 0, 0, []
    for i, ref in enumerate(references):
        ours = logits[i]
        if ours is not None:
            ours = ours.float()
            # NaN / inf (a row nobody wrote) must fail the check, not vanish in max()
            error = torch.nan_to_num((ours - ref).abs(), nan=float("inf"))
            worst = max(worst, (error.max() / ref.abs().max().clamp_min(1e-30)).item())
            per_position.append(error.amax(-1) / ref.abs().amax(-1).clamp_min(1e-30))
            nonfinite += (~torch.isfinite(ours).all(-1)).sum().item()
        ids = ours.argmax(-1) if ours is not None else top1[i]
        agree += (ids == ref.argmax(-1)).sum().item()
        total += ref.shape[0]
    median = torch.cat(per_position).median().item() if per_position else 0.0
    return {"max_rel_error": worst, "median_rel_error": median, "top1_agreement": agree / total if total else 1.0,
            "positions": total, "nonfinite_positions": nonfinite}


# -- the noise floor of a 16-bit check -------------------------------------------------------
# A 16-bit model compared with another 16-bit computation of itself (other GEMM shapes, sums in
# another order) differs wherever a router score rounds across a near-tie: the token then gets
# other experts. DeepSeek-V3's routing turns such a flip into a large logit change (8 experts of
# weight ~2.5/8 each, picked from 4 of 8 groups: one flip swaps a whole expert, or a group), and
# the changed hidden state moves the later layers' routing: at its real shapes the single-device
# bf16 model is about as far from its own fp32 version as from our parallel bf16 run (README).
# So a 16-bit run is judged against the fp32 model beside the 16-bit single-device model's own
# error against it (the noise floor): ours agrees when it is near the floor.
FP32_REFERENCE_EXPERTS = "eager"  # a loop over the experts hit; batched_mm would gather one fp32
#                                   weight matrix per route (176 MB each at DeepSeek-V3 shapes)


def fp32_reference(config, device, seed: int = 0):
    """The single-device model in fp32 with the same random weights (the floor's yardstick)."""
    from .parallel import reference_model

    model = reference_model(config, device=device, dtype=torch.float32, seed=seed)
    model.set_experts_implementation(FP32_REFERENCE_EXPERTS)
    return model


def against_fp32(reference32, prompts: torch.Tensor, fed, ours, single_device) -> dict:
    """ours and single_device (the 16-bit single-device model's logits), each one tensor per
    sequence of prompts / fed, against the fp32 reference: {"ours": ..., "single_device": ...}
    (compare_logits dicts). Agreement means "ours" is no worse than "single_device"."""
    refs = list(reference_logits(reference32, prompts, fed))
    return {"ours": compare_logits(refs, ours), "single_device": compare_logits(refs, single_device)}


def count_region_calls(model) -> list:
    """Wrap a compiled model's region functions (ParallelCausalLM.compile) so that every call
    of them appends to the returned list: how tests see that decode steps ran them."""
    calls = []

    def counted(region):
        def run(*args):
            calls.append(1)
            return region(*args)
        return run

    model.compiled = tuple(counted(region) for region in model.compiled)
    return calls
