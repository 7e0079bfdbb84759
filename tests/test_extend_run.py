"""Extending a finished run: `train --resume RUN --steps N --time-limit-minutes M` trains on from the run's
last checkpoint (docs/runs.md). The warm start is not run again, the lr schedule spans the new steps, and the
time limit counts from this command's start."""

import json
import math
import time

import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import build_config
from mlx_grpo.models.loading import embedded_model_path
from mlx_grpo.run import loop, trainer
from mlx_grpo.tasks.registry import recommended_settings

pytestmark = pytest.mark.skipif(
    not (embedded_model_path() / "config.json").exists(),
    reason="the embedded model has not been built (scripts/build_tiny_model.py)",
)

LR = 1e-3


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _cosine(step: int, steps: int) -> float:
    """The lr logged at `step` under make_optimizer's schedule over `steps` (no warmup, min_lr_ratio 0.1):
    the value before that step's update."""
    end = LR * 0.1
    return end + (LR - end) * 0.5 * (1 + math.cos(math.pi * (step - 1) / steps))


def test_a_finished_warm_started_run_is_extended_by_resume(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    settings = {
        "task": "arith",
        "steps": 2,
        "batch_size": 2,
        "group_size": 2,
        "max_tokens": 8,
        "eval_num_problems": 4,
        "lora_rank": 4,
        "warmup_steps": 0,
        "lr": LR,
        "skip_no_signal": False,  # every step ticks the schedule
        "warm_start_steps": 2,
        "warm_start_batch_size": 2,
        "save_every": 1,
        "output": str(run_dir),
    }
    trainer.train(build_config(settings, task_defaults=recommended_settings))
    stage = run_dir / "warm_start" / "summary.json"
    stamp = stage.stat().st_mtime_ns

    elapsed = []
    real = loop.past_time_limit

    def recording(config, seconds, history, eval_seconds):
        elapsed.append(seconds)
        return real(config, seconds, history, eval_seconds)

    monkeypatch.setattr(loop, "past_time_limit", recording)
    began = time.perf_counter()
    out = CliRunner().invoke(
        app, ["train", "--resume", str(run_dir), "--steps", "4", "--time-limit-minutes", "60"]
    )
    took = time.perf_counter() - began
    assert out.exit_code == 0, out.output
    assert "resuming after step 2" in out.output and "supervised steps" not in out.output
    assert stage.stat().st_mtime_ns == stamp  # the warm start is not run again
    steps = [m for m in _rows(run_dir / "metrics.jsonl") if "lr" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    # steps 1-2 followed the 2-step schedule; from step 3 the schedule spans the 4 steps now asked for
    expected = [_cosine(1, 2), _cosine(2, 2), _cosine(3, 4), _cosine(4, 4)]
    assert [m["lr"] for m in steps] == pytest.approx(expected, rel=1e-5)
    # the time limit counts from this command's start, not the run's first one
    assert elapsed and max(elapsed) < took
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["accuracy_after_warm_start"] is not None
    assert (run_dir / "checkpoints" / "step_000004").is_dir()
