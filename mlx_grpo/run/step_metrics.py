"""Step metrics the trainer works out from more than one number, for the health rules
(health.py) to read: how far an update moved the weights, and the range of a step's rewards."""

from __future__ import annotations

import math

import mlx.core as mx
from mlx.utils import tree_flatten


def relative_change(before, after) -> float:
    """||after - before|| / ||before|| over every array of two parameter trees of the same shape."""
    old, new = dict(tree_flatten(before)), dict(tree_flatten(after))
    diff = sum((mx.sum(mx.square(new[k] - v)) for k, v in old.items()), mx.array(0.0)).item()
    norm = sum((mx.sum(mx.square(v)) for v in old.values()), mx.array(0.0)).item()
    return math.sqrt(diff / norm) if norm > 0 else math.inf if diff > 0 else 0.0


def reward_range(records: list[dict]) -> dict:
    """reward/min and reward/max of one step's completion records (advantage_blowup compares to them)."""
    rewards = [r["reward"] for r in records if _finite(r.get("reward"))]
    return {"reward/min": min(rewards), "reward/max": max(rewards)} if rewards else {}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
