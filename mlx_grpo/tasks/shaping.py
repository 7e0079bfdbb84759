"""What happens to rewards between scoring and advantages.

Length penalties act on each completion's reward:

- runaway penalty (seed 001): a completion that hit `max_tokens` without the
  end marker keeps only `factor` of its reward. Multiplying, not capping,
  keeps the ranking inside a group: a cap made every runaway score the same,
  zero std, nothing learned. A negative reward is never raised by it:
  R -> R - (1 - factor) * |R|, which is R * factor when R >= 0.
- DAPO soft overlong penalty (Yu et al. 2025, arXiv:2503.14476, eq. 13): with
  L = max_tokens and a buffer B, a completion of length n gets
      0                          if n <= L - B
      (L - B - n) / B * penalty  if L - B < n <= L
  added to its reward.

Side rewards (`shaping`): every reward after the first is a side reward (a
format bonus, a length term). With `always` they count everywhere. With
`gated` they count only in groups where the first (main) reward varies: in a
group where every completion is equally wrong, a 0.1-weight format reward
would otherwise set every advantage on its own (issue 27, GSM8K on SmolLM2),
so there the group's rewards are the main reward's alone (all equal: no
gradient).

Group filters decide which groups enter the update:

- DAPO dynamic sampling: groups whose rewards are all equal carry no signal
  (every advantage is 0); they are dropped, and the batch may be refilled by
  further rollouts (the trainer does that, bounded).
- reward threshold (seed 003): groups whose best reward is below the
  threshold have nothing good to move toward; they are dropped.
"""

from __future__ import annotations

import numpy as np


SHAPING = ("always", "gated")


def gated_totals(parts: dict[str, list], weights: list[float], group_size: int) -> np.ndarray:
    """The weighted reward of each completion, side rewards dropped in groups where the main one is flat."""
    values = np.array([[0.0 if v is None else float(v) * w for v in column]
                       for column, w in zip(parts.values(), weights)])
    grouped = values.reshape(len(values), -1, group_size)
    main_varies = grouped[0].std(axis=1) > 1e-12
    totals = grouped[0] + np.where(main_varies[:, None], grouped[1:].sum(axis=0), 0.0)
    return totals.reshape(-1)


def runaway_penalty(rewards, truncated, factor: float) -> np.ndarray:
    rewards = np.asarray(rewards, dtype=np.float64)
    penalised = rewards - (1.0 - factor) * np.abs(rewards)
    return np.where(np.asarray(truncated, dtype=bool), penalised, rewards)


def overlong_penalty(lengths, max_tokens: int, buffer: int, penalty: float = 1.0) -> np.ndarray:
    """The (non-positive) DAPO soft overlong term of each completion."""
    lengths = np.asarray(lengths, dtype=np.float64)
    if buffer <= 0:
        return np.zeros_like(lengths)
    start = max_tokens - buffer
    return np.where(lengths > start, (start - np.minimum(lengths, max_tokens)) / buffer * penalty, 0.0)


def shape_rewards(rewards, lengths, truncated, *, max_tokens: int, runaway_factor: float = 1.0,
                  overlong_buffer: int = 0, overlong_scale: float = 1.0) -> np.ndarray:
    shaped = runaway_penalty(rewards, truncated, runaway_factor) if runaway_factor < 1 else np.asarray(
        rewards, dtype=np.float64)
    return shaped + overlong_penalty(lengths, max_tokens, overlong_buffer, overlong_scale)


def groups_to_keep(rewards, group_size: int, *, drop_equal: bool = False,
                   reward_threshold: float | None = None) -> np.ndarray:
    """One bool per group: does it enter the update?"""
    grouped = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    keep = np.ones(len(grouped), dtype=bool)
    if drop_equal:
        keep &= grouped.max(axis=1) - grouped.min(axis=1) > 1e-9
    if reward_threshold is not None:
        keep &= grouped.max(axis=1) >= reward_threshold
    return keep
