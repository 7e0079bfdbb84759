"""frac_zero_std: one name, one meaning: the fraction of the step's sampled groups whose rewards are
all equal, filtered out or not. The advantage statistics describe the groups trained on."""

import ast
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest

import mlx_grpo
from mlx_grpo.config import build_config
from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.trainer import train_step
from mlx_grpo.tasks.registry import Task
from mlx_grpo.update.advantages import advantage_stats


def _modules_setting(key: str) -> list[str]:
    """The package modules that write `key` as a key of a dict display."""
    found = []
    for path in sorted(Path(mlx_grpo.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == key for k in node.keys
            ):
                found.append(path.name)
    return found


def test_frac_zero_std_is_written_in_one_place():
    assert _modules_setting("frac_zero_std") == [
        "step_metrics.py"
    ]  # the step's metrics (run/step_metrics.py)
    assert set(advantage_stats([0.5, -0.5, 0.0, 0.0])) == {
        "advantage/abs_mean",
        "advantage/min",
        "advantage/max",
    }


def by_prompt(prompts, completions, **kw):
    """ "zero": every answer 0 (dropped by the threshold); "one": every answer 1 (kept, no spread);
    anything else: rewards from 1 up that differ inside the group."""
    return [
        0.0 if p == "zero" else 1.0 if p == "one" else 1.0 + (sum(map(ord, c)) % 97) / 10
        for p, c in zip(prompts, completions)
    ]


def test_a_filtered_step_counts_zero_std_over_every_sampled_group(tiny_model_path):
    task = Task("t", [{"prompt": p} for p in ("zero", "one", "var")], [], [by_prompt], [1.0], None, None, [])
    config = build_config(
        {
            "group_size": 4,
            "batch_size": 3,
            "max_tokens": 6,
            "steps": 2,
            "kl_every": 0,
            "reward_threshold": 0.5,
            "runaway_penalty": 1.0,
        }
    )
    model, tokenizer = load_policy(str(tiny_model_path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4})
    metrics, records = train_step(model, tokenizer, optim.SGD(learning_rate=0.0), task, config, 1, None)
    groups = [records[i : i + 4] for i in range(0, 12, 4)]
    flat = [len({r["reward"] for r in group}) == 1 for group in groups]
    assert sum(flat) == 2 and metrics["frac_zero_std"] == pytest.approx(np.mean(flat))  # 2 of the 3 sampled
    trained = [r["advantage"] for r in records if r["advantage"] is not None]
    assert len(trained) == 8 and metrics["filter/dropped_frac"] == pytest.approx(1 / 3)
    assert metrics["advantage/abs_mean"] == pytest.approx(np.mean(np.abs(trained)), rel=1e-6)
