"""Learning happens: a short GRPO run on the embedded model raises its reward."""

import numpy as np
import pytest

from mlx_grpo.config import build_config
from mlx_grpo.models.loading import embedded_model_path
from mlx_grpo.run.trainer import train
from mlx_grpo.tasks.registry import recommended_settings

pytestmark = pytest.mark.skipif(
    not (embedded_model_path() / "config.json").exists(),
    reason="the embedded model has not been built (scripts/build_tiny_model.py)",
)


def test_short_run_raises_reward_on_embedded_task(tmp_path):
    config = build_config(
        {"steps": 30, "eval_num_problems": 100, "output": str(tmp_path / "run"), "seed": 1},
        task_defaults=recommended_settings,
    )
    result = train(config)
    rewards = [m["reward/mean"] for m in result.history]
    early, late = np.mean(rewards[:6]), np.mean(rewards[-6:])
    assert late > early + 0.1, (early, late)
    assert result.accuracy_after > result.accuracy_before + 0.05, (
        result.accuracy_before,
        result.accuracy_after,
    )
    # the loop stayed healthy: gradients finite and clipped at most sometimes, nothing skipped
    assert all(np.isfinite(m["grad_norm"]) and m["update/nonfinite"] == 0 for m in result.history)
