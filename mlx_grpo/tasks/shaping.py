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
format bonus, a length term). With `always` they count everywhere. In a group
where every completion is equally wrong, a 0.1-weight format reward then sets
every advantage on its own (GSM8K on SmolLM2-135M: the model learned to
write "#### 3" and stop; docs/health.md, reward_takeover). The other two modes take that away:

- `gated`: side rewards count only in groups where the first (main) reward
  varies; elsewhere the group's rewards are the main reward's alone (all
  equal: no gradient).
- `scaled`: each completion's side rewards are multiplied by where its main
  reward lies in its group, (main - group min) / (group max - group min): 0
  in a flat group, and with a right/wrong main reward a side reward is paid
  on right answers only, so it never ranks one wrong answer above another.

Group filters decide which groups enter the update:

- DAPO dynamic sampling: groups whose rewards are all equal carry no signal
  (every advantage is 0); they are dropped, and the batch may be refilled by
  further rollouts (the trainer does that, bounded).
- reward threshold (seed 003): groups whose best reward is below the
  threshold have nothing good to move toward; they are dropped.

`step_rewards` applies all of these as a run's settings say: train's step
(run/step_rollouts.py) and the API's Trainer.update both call it, so a group
is shaped and filtered the same way whoever sampled and scored it.
"""

from __future__ import annotations

import numpy as np

from ..config import TrainConfig
from .registry import Task, token_budget
from .rewarding import Scores


SHAPING = ("always", "gated", "scaled")  # config_checks.py repeats these (it sits below tasks/)


def side_shaped_parts(parts: dict[str, list], weights: list[float], group_size: int, mode: str) -> np.ndarray:
    """What each reward adds to each completion's total, its side rewards counted as `mode` says.

    parts holds each reward's values in order (the first is the main reward; None, a
    failed reward call, counts 0), weights their weights; completions come group by
    group. Returns (rewards, completions): weight x value, side rows shaped.
    """
    if len(weights) != len(parts):  # zip would drop the unweighted rewards without a word
        raise ValueError(f"{len(parts)} rewards ({', '.join(parts)}) but {len(weights)} weights")
    values = np.array(
        [[0.0 if v is None else float(v) * w for v in column] for column, w in zip(parts.values(), weights)]
    ).reshape(len(parts), -1, group_size)
    main = values[0]  # (groups, completions)
    low, high = main.min(axis=1, keepdims=True), main.max(axis=1, keepdims=True)
    varies = high - low > 1e-12
    if mode == "gated":
        factor = np.broadcast_to(varies, main.shape).astype(float)
    elif mode == "scaled":
        factor = np.where(varies, (main - low) / np.where(varies, high - low, 1.0), 0.0)
    elif mode == "always":
        factor = np.ones_like(main)
    else:
        raise ValueError(f"unknown shaping {mode!r}")
    values[1:] *= factor
    return values.reshape(len(parts), -1)


def side_shaped_totals(
    parts: dict[str, list], weights: list[float], group_size: int, mode: str
) -> np.ndarray:
    """The weighted reward of each completion, its side rewards counted as `mode` says."""
    return side_shaped_parts(parts, weights, group_size, mode).sum(axis=0)


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


def shape_rewards(
    rewards,
    lengths,
    truncated,
    *,
    max_tokens: int,
    runaway_factor: float = 1.0,
    overlong_buffer: int = 0,
    overlong_scale: float = 1.0,
) -> np.ndarray:
    shaped = (
        runaway_penalty(rewards, truncated, runaway_factor)
        if runaway_factor < 1
        else np.asarray(rewards, dtype=np.float64)
    )
    return shaped + overlong_penalty(lengths, max_tokens, overlong_buffer, overlong_scale)


def groups_to_keep(
    rewards, group_size: int, *, drop_equal: bool = False, reward_threshold: float | None = None
) -> np.ndarray:
    """One bool per group: does it enter the update?"""
    grouped = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    keep = np.ones(len(grouped), dtype=bool)
    if drop_equal:
        keep &= grouped.max(axis=1) - grouped.min(axis=1) > 1e-9
    if reward_threshold is not None:
        keep &= grouped.max(axis=1) >= reward_threshold
    return keep


def step_rewards(
    task: Task, config: TrainConfig, completions: list, scores: Scores
) -> tuple[np.ndarray, np.ndarray]:
    """(rewards, keep) of scored groups of `config.group_size`, as a run's settings shape and filter them.

    rewards: one a completion, what advantages are computed from: side rewards counted as
    `shaping` says (from `scores.parts`; with no parts, `scores.total` as it is), then the
    runaway and overlong penalties against the task's token budget. keep: one bool a group,
    whether dynamic_sampling and reward_threshold let it into the update.
    """
    g = config.group_size
    totals = (
        side_shaped_totals(scores.parts, task.reward_weights, g, config.shaping)
        if config.shaping != "always" and scores.parts
        else scores.total
    )
    # A rollout's length is what the model wrote, against its budget (an episode's: max_episode_tokens).
    rewards = shape_rewards(
        totals,
        [c.model_tokens for c in completions],
        [c.truncated for c in completions],
        max_tokens=token_budget(task, config),
        runaway_factor=config.runaway_penalty,
        overlong_buffer=config.overlong_buffer,
        overlong_scale=config.overlong_penalty,
    )
    if config.dynamic_sampling or config.reward_threshold is not None:
        keep = groups_to_keep(
            rewards, g, drop_equal=config.dynamic_sampling, reward_threshold=config.reward_threshold
        )
    else:
        keep = np.ones(len(rewards) // g, dtype=bool)
    return rewards, keep
