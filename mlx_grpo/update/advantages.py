"""Group-baseline advantages.

For prompt q with a group of G completions and rewards R_1..R_G:

    A_i = R_i - mean_group(R)                      scale = "none"  (default)
    A_i = (R_i - mean_group(R)) / (std_group + eps) scale = "group"
    A_i = (R_i - mean_group(R)) / (std_batch + eps) scale = "batch"

"none" is the default on purpose: when a decent model's rewards in a group are
close together (say [0.62, 0.68, 0.71, 0.65], std 0.04) dividing by the std blows
the advantages up ~25x and training oscillates without progress (seeds 000, 004).
Standard deviations are population std (ddof=0) over the group.
"""

from __future__ import annotations

import numpy as np

SCALE_MODES = ("none", "group", "batch")


def group_advantages(rewards, group_size: int, scale: str = "none", eps: float = 1e-4) -> np.ndarray:
    """Advantages for rewards laid out group by group: [q0 o1..oG, q1 o1..oG, ...]."""
    if scale not in SCALE_MODES:
        raise ValueError(f"scale must be one of {SCALE_MODES}, got {scale!r}")
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 1 or rewards.size % group_size:
        raise ValueError(
            f"expected a flat list of rewards, a multiple of group_size={group_size}, "
            f"got shape {rewards.shape}"
        )
    grouped = rewards.reshape(-1, group_size)
    advantages = grouped - grouped.mean(axis=1, keepdims=True)
    if scale == "group":
        advantages = advantages / (grouped.std(axis=1, keepdims=True) + eps)
    elif scale == "batch":
        advantages = advantages / (rewards.std() + eps)
    return advantages.reshape(-1)


def zero_std_frac(rewards, group_size: int) -> float:
    """The fraction of groups whose rewards are all equal (no signal): the step's `frac_zero_std`,
    over every group sampled, filtered out or not (the one place it is defined)."""
    grouped = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    return float(np.mean(grouped.std(axis=1) < 1e-8))


def advantage_stats(advantages) -> dict:
    """What to watch: the spread of the advantages trained on."""
    advantages = np.asarray(advantages, dtype=np.float64)
    return {
        "advantage/abs_mean": float(np.abs(advantages).mean()),
        "advantage/min": float(advantages.min()),
        "advantage/max": float(advantages.max()),
    }
