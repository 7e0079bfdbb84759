"""time_limit_minutes: a run stops starting steps in time for its final evaluation, then saves and
evaluates."""

import json

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.config import build_config
from mlx_grpo.run import checkpoint as ckpt
from mlx_grpo.run import loop, run_result, trainer


def test_one_more_step_and_the_evaluation_must_fit():
    config = build_config({"time_limit_minutes": 10})
    history = [{"time/step_s": 100.0}, {"time/step_s": 140.0}]  # a mean step of 120 s
    assert not loop.past_time_limit(config, 400.0, history, 60.0)  # 400 + 120 + 60 = 580 <= 600
    assert loop.past_time_limit(config, 430.0, history, 60.0)  # 610 > 600
    assert not loop.past_time_limit(config, 10_000.0, [], 60.0)  # never before a step of its own
    assert not loop.past_time_limit(build_config({}), 10_000.0, history, 60.0)  # 0: no limit


def test_a_bad_limit_is_refused_in_one_line():
    from mlx_grpo.config import ConfigError

    with pytest.raises(ConfigError, match="time_limit_minutes must be >= 0"):
        build_config({"time_limit_minutes": -1})


def test_a_run_past_its_limit_saves_and_evaluates_its_last_step(tmp_path, monkeypatch):
    """The limit is reached after step 2 of 6: step 2's checkpoint holds the weights the final
    evaluation saw, metrics and summary name step 2, and the display heard why."""
    monkeypatch.setattr(loop, "past_time_limit", lambda config, elapsed, history, eval_s: len(history) >= 2)
    seen = []
    monkeypatch.setattr(run_result, "evaluate", lambda *a: {"accuracy": 0.5, "n": 4, "seconds": 0.0})
    config = build_config(
        {
            "steps": 6,
            "batch_size": 2,
            "group_size": 2,
            "max_tokens": 8,
            "save_every": 5,
            "time_limit_minutes": 1,
            "output": str(tmp_path / "run"),
        }
    )
    result = trainer.train(config, on_event=lambda kind, data: seen.append((kind, data)))
    assert [d for k, d in seen if k == "time_limit"] == [{"step": 2, "total": 6, "minutes": 1}]
    assert [m["step"] for m in result.history] == [1, 2]
    assert ckpt.latest_checkpoint(result.run_dir).name == ckpt.checkpoint_name(2)
    metrics = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1] == {"step": 2, "eval/accuracy": 0.5, "final": True}
    assert json.loads((result.run_dir / "summary.json").read_text())["steps"] == 2
    last = mx.load(str(result.run_dir / "checkpoints" / "step_000002" / "adapters.safetensors"))
    saved = mx.load(str(result.run_dir / "adapters.safetensors"))
    assert all(np.array_equal(np.array(last[k]), np.array(saved[k])) for k in saved)


def test_a_resumed_run_leaves_room_for_the_evaluation_measured_before_the_first_step(tmp_path, monkeypatch):
    """The evaluation before training is not run again on resume; its time, kept in the checkpoint, still
    counts against the limit, so the resumed run stops in time for its final evaluation."""
    monkeypatch.setattr(run_result, "evaluate", lambda *a: {"accuracy": 0.5, "n": 4, "seconds": 42.0})
    reserved = []

    def record(config, elapsed, history, eval_s):
        reserved.append(eval_s)
        return False

    monkeypatch.setattr(loop, "past_time_limit", record)

    class Interrupt(Exception):
        pass

    def stop_after_step_1(kind, data):
        if kind == "checkpoint" and data["step"] == 1:
            raise Interrupt

    settings = {
        "steps": 2,
        "batch_size": 2,
        "group_size": 2,
        "max_tokens": 8,
        "save_every": 1,
        "time_limit_minutes": 60,
        "output": str(tmp_path / "run"),
    }
    with pytest.raises(Interrupt):
        trainer.train(build_config(settings), on_event=stop_after_step_1)
    assert reserved == [42.0]
    trainer.train(build_config({**settings, "resume": str(tmp_path / "run")}))
    assert reserved == [42.0, 42.0]  # step 2, in the resumed run
