"""sft's held-out accuracy checks (and so the warm start's, which train reuses) are guarded as train's are
(run/setup.py's guard_task): the same screened rows, every reward call bounded by reward_timeout."""

import threading
import time

import pytest

from mlx_grpo.config import build_config
from mlx_grpo.run import setup as run_setup
from mlx_grpo.run import sft_setup as sft_setup_module
from mlx_grpo.run.setup import setup
from mlx_grpo.run.sft import sft
from mlx_grpo.run.warm_start import run_warm_start
from mlx_grpo.tasks.rewarding import RewardError

SETTINGS = {
    "task": "arith",
    "steps": 1,
    "batch_size": 2,
    "micro_batch_size": 2,
    "lora_rank": 2,
    "eval_num_problems": 3,
    "max_tokens": 4,
}


def _config(tiny_model_path, **values):
    return build_config({**SETTINGS, "model": str(tiny_model_path), **values})


def _patch_load_task(monkeypatch, change, modules=(sft_setup_module,)):
    """Each module's task loader (sft's base_task, train's load_task) gives the task with `change(task)`
    applied (before any guard)."""
    for module in modules:
        name = "base_task" if hasattr(module, "base_task") else "load_task"
        real = getattr(module, name)

        def load(config, real=real):
            task = real(config)
            change(task)
            return task

        monkeypatch.setattr(module, name, load)


def test_a_hanging_reward_ends_in_the_reward_timeout_in_sft_s_check(tiny_model_path, tmp_path, monkeypatch):
    release = threading.Event()  # the abandoned calls end with the test

    def stuck(prompts, completions, answer, **kwargs):
        release.wait(30)
        return [0.0 for _ in completions]

    _patch_load_task(monkeypatch, lambda task: setattr(task, "accuracy_reward", stuck))
    config = _config(tiny_model_path, reward_timeout=0.5, output=str(tmp_path / "run"))
    start = time.perf_counter()
    try:
        with pytest.raises(
            RewardError, match=r"reward 'stuck' failed on all 3 completions.*timed out after 0.5s"
        ):
            sft(config)
    finally:
        release.set()
    assert time.perf_counter() - start < 25  # the batch call and each of the 3 alone: 0.5 s each, not 30


def _with_bad_rows(task):
    """Three good held-out rows, one without the answer column the accuracy reward needs, one whose prompt is
    far over max_prompt_tokens: train's screen keeps the three."""
    good = task.eval_rows[:3]
    task.eval_rows = [
        good[0],
        {"prompt": "What is 2 + 2?"},
        good[1],
        {"prompt": "What is " + "1 + " * 300 + "1?", "answer": "301"},
        good[2],
    ]


def test_sft_s_check_leaves_out_the_rows_train_s_screen_leaves_out(tiny_model_path, tmp_path, monkeypatch):
    _patch_load_task(monkeypatch, _with_bad_rows, (sft_setup_module, run_setup))
    config = _config(tiny_model_path, max_prompt_tokens=400, output=str(tmp_path / "run"))
    assert len(setup(config).task.eval_rows) == 3  # train's own check

    events = []
    result = sft(config, on_event=lambda kind, data: events.append((kind, data)))
    checks = {
        data["when"]: data for kind, data in events if kind == "eval" and data.get("accuracy") is not None
    }
    assert checks["before"]["n"] == checks["after"]["n"] == result.eval_n == 3
    warnings = next(data["warnings"] for kind, data in events if kind == "start")
    assert any("arith evaluation data" in w and "2 bad row(s)" in w for w in warnings), warnings

    # The warm start's checks, which train reports as its base's and starting accuracy, are over the same
    # rows.
    stage = run_warm_start(
        _config(
            tiny_model_path, max_prompt_tokens=400, warm_start_steps=1, steps=1, output=str(tmp_path / "warm")
        ),
        tmp_path / "warm",
        lambda kind, data: None,
    )
    assert stage.check["n"] == 3 and stage.accuracy_before is not None
