"""The range of a step's rewards, from its completion records: the trainer logs it for the
advantage_blowup health rule (health.py) to compare advantages against."""

from __future__ import annotations

import math


def reward_range(records: list[dict]) -> dict:
    """reward/min and reward/max of one step's completion records (advantage_blowup compares to them)."""
    rewards = [r["reward"] for r in records if _finite(r.get("reward"))]
    return {"reward/min": min(rewards), "reward/max": max(rewards)} if rewards else {}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
