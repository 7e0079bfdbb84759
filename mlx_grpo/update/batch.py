"""How rollouts become the update's arrays.

The prompts of a step come in a fixed, seeded order (`batch_rows`), so a
resumed run sees the same ones. A rollout batch is laid out group by group
(`RolloutBatch`) and cut into micro-batches of whole groups (`MicroBatch`),
each prompt left-padded once and its G completions right-padded, which is the
shape `logprobs.completion_logprobs` wants. A group cut into pieces may have its
rows ordered by length first (`by_length`), so that a piece pads only as far as
its own rows need; `padded_fraction` says how much of the update's slots is padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import mlx.core as mx
import numpy as np

from ..device import on_cpu
from .losses import BatchShape


def batch_rows(rows: list[dict], step: int, batch_size: int, seed: int) -> list[dict]:
    """The prompts of `step` (1-based): a fresh seeded shuffle per pass over the data."""
    n = len(rows)
    picked = []
    for position in range((step - 1) * batch_size, step * batch_size):
        epoch, index = divmod(position, n)
        order = np.random.default_rng([seed, epoch]).permutation(n)
        picked.append(rows[int(order[index])])
    return picked


@runtime_checkable
class Rollout(Protocol):
    """One sampled answer as the step reads it: a single-turn `Completion` (sampling/rollout.py) or a
    multi-turn `Episode` (sampling/multiturn.py, which adds `mask`: 0 on the environment's tokens)."""

    prompt_index: int
    prompt_tokens: list[int]
    tokens: list[int]  # what is trained on, after the prompt
    logprobs: list[float]  # behaviour log mu of each token
    finish_reason: str
    text: str

    @property
    def truncated(self) -> bool: ...  # cut at its token budget before it ended: the one meaning of "cut"

    @property
    def model_tokens(self) -> int: ...  # tokens the model wrote: its length, against that budget


@dataclass
class RolloutBatch:
    """The update's arrays, group by group: rows i*G .. i*G+G-1 continue prompt i."""

    prompts: list[list[int]]  # one per group
    completions: np.ndarray  # (N, K) int32 sampled ids, right-padded
    mask: np.ndarray  # (N, K) 1 on real completion tokens
    behaviour_logp: np.ndarray  # (N, K) log mu of each sampled token, 0 on padding
    advantages: np.ndarray  # (N,)
    group_size: int
    guided: np.ndarray | None = None  # (N,) True on reference answers (--guide); None: none


@dataclass
class MicroBatch:
    prompts: mx.array  # (P, Lp) left-padded
    left_padding: mx.array  # (P,)
    completions: mx.array  # (P*G, K)
    mask: mx.array
    behaviour_logp: mx.array
    advantages: mx.array
    group_size: int  # completions per prompt here: the group's, or fewer when a group is cut into pieces
    piece_of: int | None = (
        None  # the group this is a piece of (its pieces are consecutive); None: whole groups
    )
    guided: mx.array | None = None  # (P*G,) True on reference answers (--guide); None: none


def prompt_runs(parts: list[MicroBatch]) -> list[range]:
    """Indices of `parts` in runs that share one prompt pass: each cut group's pieces, else one
    micro-batch."""
    runs, start = [], 0
    while start < len(parts):
        end, group = start + 1, parts[start].piece_of
        while group is not None and end < len(parts) and parts[end].piece_of == group:
            end += 1
        runs.append(range(start, end))
        start = end
    return runs


def build_batch(completions: list[Rollout], advantages, group_size: int) -> RolloutBatch:
    n = len(completions)
    width = max(len(c.tokens) for c in completions)
    tokens = np.zeros((n, width), dtype=np.int32)
    mask = np.zeros((n, width), dtype=np.float32)
    behaviour = np.zeros((n, width), dtype=np.float32)
    for i, c in enumerate(completions):
        k = len(c.tokens)
        tokens[i, :k], behaviour[i, :k] = c.tokens, c.logprobs
        # Multi-turn episodes carry their own mask: 0 on the environment's tokens.
        mask[i, :k] = c.mask if getattr(c, "mask", None) is not None else 1.0
    prompts = [completions[g * group_size].prompt_tokens for g in range(n // group_size)]
    guided = np.array([getattr(c, "guided", False) for c in completions], dtype=bool)
    return RolloutBatch(
        prompts,
        tokens,
        mask,
        behaviour,
        np.asarray(advantages, dtype=np.float32),
        group_size,
        guided if guided.any() else None,
    )


def groups_with_signal(batch: RolloutBatch, silent: bool = False) -> RolloutBatch:
    """Only the groups whose advantages are not all zero (`silent`: only the others).

    With beta = 0 a completion with advantage 0 contributes exactly nothing to
    the loss or its gradient, so leaving its group out of the forward and
    backward passes changes no number and saves the work (often half the
    groups, when every completion of a prompt is right or every one is wrong).
    """
    g = batch.group_size
    keep = [
        i for i in range(len(batch.prompts)) if np.any(batch.advantages[i * g : (i + 1) * g] != 0) != silent
    ]
    rows = np.concatenate([np.arange(i * g, (i + 1) * g) for i in keep]) if keep else np.zeros(0, dtype=int)
    return RolloutBatch(
        [batch.prompts[i] for i in keep],
        batch.completions[rows],
        batch.mask[rows],
        batch.behaviour_logp[rows],
        batch.advantages[rows],
        g,
        None if batch.guided is None else batch.guided[rows],
    )


def carries_signal(batch: RolloutBatch) -> bool:
    """Whether a sequence with a token in the loss has a non-zero advantage: else the policy term's
    gradient is exactly zero (the loss's KL or entropy term, if any, is the trainer's to weigh)."""
    live = batch.mask.any(axis=1)
    return bool(np.any(batch.advantages[live] != 0))


def _pieces(group_size: int, size: int) -> list[tuple[int, int]]:
    """Row ranges that cut one group into near-equal pieces of at most `size` rows."""
    count = -(-group_size // size)
    bounds = [round(i * group_size / count) for i in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


# On a CPU a micro-batch's activations (what the backward pass keeps) stay near
# this many bytes: past a few hundred positions its matmuls run no faster, while
# memory grows with every row. SmolLM2-135M, 16 rows of 48 tokens: pieces of 3
# rows updated as fast as 16 rows at once (within the noise of a loaded machine),
# 0.40 GB above the weights instead of 1.73 GB.
CPU_ACTIVATION_BUDGET = 384 * 2**20


def activation_bytes_per_position(model) -> int | None:
    """A float32 estimate of what one position keeps for the backward pass (None: shape unknown).

    About 24 floats per hidden unit and layer (the layers' inputs, attention and
    MLP intermediates, the adapters') and 4 per vocabulary entry (logits, their
    exponentials and gradients); fitted to SmolLM2-135M's measured 2.2 MB. It sets how many rows a
    micro-batch takes; whether one pass recomputes its layers is recompute.kept_activation_bytes'
    estimate, which also counts the attention's scores (quadratic in the length).
    """
    args = getattr(model, "args", None)
    try:
        return 4 * (24 * args.hidden_size * args.num_hidden_layers + 4 * args.vocab_size)
    except (AttributeError, TypeError):
        return None


def memory_bound_size(size: int, model, positions: int) -> int:
    """`size` sequences a micro-batch, or fewer on a CPU where rows of `positions` would pass the budget.

    On a GPU wide micro-batches are what keep it busy, and its memory is the limit that matters there.
    """
    per_position = activation_bytes_per_position(model)
    if not on_cpu() or not per_position:
        return size
    return max(1, min(size, CPU_ACTIVATION_BUDGET // (per_position * max(positions, 1))))


def micro_batch_count(num_groups: int, group_size: int, size: int) -> int:
    """How many micro-batches `micro_batches` cuts `num_groups` groups into (before dropping empty ones)."""
    if size >= group_size:
        return -(-num_groups // (size // group_size))
    return num_groups * len(_pieces(group_size, size))


def batch_shape(batch: RolloutBatch, size: int, max_tokens: int, by_length: bool = False) -> BatchShape:
    """The whole batch's sizes for the loss's normalisers, cut into micro-batches of `size`.

    bnpo's count is of the micro-batches `micro_batches(batch, size, by_length)` gives: one whose every
    token is masked (every completion cut, with mask_truncated) is dropped there and is none of its terms."""
    ends = _row_ends(batch.mask)
    micro = sum(1 for *_, rows in _spans(batch, size, by_length) if ends[rows].any())
    return BatchShape(
        num_sequences=len(batch.advantages),
        num_tokens=int(batch.mask.sum()),
        num_micro_batches=micro,
        max_tokens=max_tokens,
    )


def _row_ends(mask: np.ndarray) -> np.ndarray:
    """One past each row's last masked-in column (0: every token masked): the width the row needs.

    Multi-turn masks have zeros inside (the environment's tokens), not only at the end."""
    live = np.asarray(mask) > 0
    return np.where(live.any(axis=1), live.shape[1] - np.argmax(live[:, ::-1], axis=1), 0)


def _spans(batch: RolloutBatch, size: int, by_length: bool = False) -> list[tuple]:
    """(groups, completions per prompt, the group it is a piece of or None, rows) of each micro-batch.

    `by_length`: a group cut into pieces has its rows ordered by `_row_ends` (stably) before the cut,
    so rows of similar length share a piece. Whole groups keep their rows and their order."""
    g, n = batch.group_size, len(batch.prompts)
    if size >= g:
        per = size // g
        return [
            (range(i, min(i + per, n)), g, None, slice(i * g, min(i + per, n) * g)) for i in range(0, n, per)
        ]
    ends = _row_ends(batch.mask)
    spans = []
    for i in range(n):
        rows = np.arange(i * g, (i + 1) * g)
        if by_length:
            rows = rows[np.argsort(ends[rows], kind="stable")]
        spans += [(range(i, i + 1), stop - start, i, rows[start:stop]) for start, stop in _pieces(g, size)]
    return spans


def micro_batches(batch: RolloutBatch, size: int, by_length: bool = False) -> list[MicroBatch]:
    """Whole groups, about `size` sequences each, each padded only as far as it needs.

    With `size` below the group size each group is cut into pieces of at most
    `size` sequences (marked with `piece_of`): the update's memory then follows
    `size`, whatever the group size, and the pieces share one prompt pass (gradients.py).
    `by_length` puts a group's rows of similar length in the same piece (each row's
    completion, mask, behaviour log-probs and advantage travel together). Every loss
    but bnpo is the same however its rows are cut; bnpo's token mean is per micro-batch,
    so which rows share a piece is part of its objective (`by_length` False keeps them in order).
    """
    ends = _row_ends(batch.mask)
    out = []
    for groups, group_size, piece_of, rows in _spans(batch, size, by_length):
        prompts = [batch.prompts[i] for i in groups]
        width = int(ends[rows].max())
        if width == 0:  # every token masked (all truncated, with mask_truncated): nothing to train on
            continue
        longest = max(len(p) for p in prompts)
        padded = np.zeros((len(prompts), longest), dtype=np.int32)
        for i, p in enumerate(prompts):
            padded[i, longest - len(p) :] = p
        out.append(
            MicroBatch(
                mx.array(padded),
                mx.array([longest - len(p) for p in prompts]),
                mx.array(batch.completions[rows, :width]),
                mx.array(batch.mask[rows, :width]),
                mx.array(batch.behaviour_logp[rows, :width]),
                mx.array(batch.advantages[rows]),
                group_size,
                piece_of,
                None if batch.guided is None else mx.array(batch.guided[rows]),
            )
        )
    return out


def padded_fraction(parts: list[MicroBatch]) -> float | None:
    """The share of the micro-batches' completion slots (rows x width) that no row needs: the slots past
    each row's last masked-in column (None: no slots). A single-turn row needs its masked-in tokens; a
    multi-turn row also the environment's tokens between its turns, which its later turns read."""
    slots = sum(mb.mask.shape[0] * mb.mask.shape[1] for mb in parts)
    needed = sum(int(_row_ends(np.array(mb.mask)).sum()) for mb in parts)
    return (slots - needed) / slots if slots else None
