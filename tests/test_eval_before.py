"""eval_before: false skips the held-out check before the first step (train, sft, a warm start's base check)
and leaves the accuracy after a warm start, the final check and resume as they were."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import build_config, dump_yaml
from mlx_grpo.models.loading import embedded_model_path
from mlx_grpo.run import checkpoint as ckpt
from mlx_grpo.run import loop, run_result, trainer
from mlx_grpo.tasks.registry import recommended_settings

needs_embedded = pytest.mark.skipif(
    not (embedded_model_path() / "config.json").exists(),
    reason="the embedded model has not been built (scripts/build_tiny_model.py)",
)

SMALL = {"steps": 2, "batch_size": 2, "group_size": 2, "max_tokens": 8, "save_every": 1}


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _counted(monkeypatch, answer=None) -> list:
    """Replace the held-out check train and sft look up (run_result.evaluate) by one that records each call
    (and answers `answer`, or runs the real check)."""
    calls, real = [], run_result.evaluate

    def evaluate(*args):
        calls.append(args)
        return dict(answer) if answer is not None else real(*args)

    monkeypatch.setattr(run_result, "evaluate", evaluate)
    return calls


def test_the_setting_defaults_to_true_and_round_trips_through_config_yaml(tmp_path):
    assert build_config({}).eval_before is True
    written = tmp_path / "config.yaml"
    written.write_text(dump_yaml(build_config({"eval_before": False})))
    assert "eval_before: false" in written.read_text()
    assert build_config(config_file=str(written)).eval_before is False


def test_train_without_the_check_before_measures_only_the_end(tmp_path, monkeypatch):
    calls = _counted(monkeypatch, {"accuracy": 0.5, "n": 4, "seconds": 3.0})
    with_check = trainer.train(build_config({**SMALL, "output": str(tmp_path / "checked")}))
    assert len(calls) == 2 and with_check.accuracy_before == 0.5  # the counter sees the check before too
    calls.clear()
    events = []
    result = trainer.train(
        build_config({**SMALL, "eval_before": False, "output": str(tmp_path / "run")}),
        on_event=lambda kind, data: events.append((kind, data)),
    )
    assert len(calls) == 1  # the final check alone
    assert (result.accuracy_before, result.accuracy_after, result.eval_n) == (None, 0.5, 4)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["accuracy_before"] is None and summary["accuracy_after"] == 0.5
    assert summary["line"] == "accuracy not checked before -> 0.50 on 4 held-out problems"
    rows = _lines(result.run_dir / "metrics.jsonl")
    assert not [r for r in rows if "before" in r] and rows[-1] == {
        "step": 2,
        "eval/accuracy": 0.5,
        "final": True,
    }
    before = [data for kind, data in events if kind == "eval" and data["when"] == "before"]
    assert len(before) == 1 and before[0]["accuracy"] is None and before[0]["not_checked"]


def test_the_display_says_not_checked(tmp_path, monkeypatch):
    _counted(monkeypatch, {"accuracy": 0.25, "n": 4, "seconds": 1.0})
    out = CliRunner().invoke(
        app,
        [
            "train",
            "--no-eval-before",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--max-tokens",
            "8",
            "--output",
            str(tmp_path / "run"),
        ],
    )
    assert out.exit_code == 0, out.output
    assert "accuracy before training: not checked (eval_before: false)" in out.output
    assert "accuracy not checked before -> 0.25 on 4 held-out problems" in out.output
    assert "None" not in out.output


def test_without_the_check_before_the_first_timed_check_is_reserved(tmp_path, monkeypatch):
    """No check before: nothing is reserved for the final check until one every eval_steps is timed."""
    _counted(monkeypatch, {"accuracy": 0.5, "n": 4, "seconds": 42.0})
    reserved = []

    def record(config, elapsed, history, eval_s):
        reserved.append(eval_s)
        return False

    monkeypatch.setattr(loop, "past_time_limit", record)
    settings = {**SMALL, "steps": 3, "eval_before": False, "time_limit_minutes": 60}
    trainer.train(build_config({**settings, "output": str(tmp_path / "plain")}))
    assert reserved == [0.0, 0.0, 0.0]
    reserved.clear()
    trainer.train(build_config({**settings, "eval_steps": 1, "output": str(tmp_path / "evaluated")}))
    assert reserved == [0.0, 42.0, 42.0]


def test_a_resumed_run_keeps_no_before_accuracy(tmp_path, monkeypatch):
    """Interrupted after step 1, `train --resume RUN` (reading RUN/config.yaml): no check before either time,
    the checkpoint's None comes back as None, and the final check runs once."""
    calls = _counted(monkeypatch, {"accuracy": 0.5, "n": 4, "seconds": 1.0})
    run_dir = tmp_path / "run"

    class Interrupt(Exception):
        pass

    def stop_after_step_1(kind, data):
        if kind == "checkpoint" and data["step"] == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        trainer.train(
            build_config({**SMALL, "eval_before": False, "output": str(run_dir)}), on_event=stop_after_step_1
        )
    assert calls == []
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["eval_before"] is False
    state = json.loads((ckpt.latest_checkpoint(run_dir) / "state.json").read_text())
    assert "eval_before" in state and state["eval_before"] is None
    out = CliRunner().invoke(app, ["train", "--resume", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert len(calls) == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["accuracy_before"] is None and summary["accuracy_after"] == 0.5 and summary["steps"] == 2
    assert not [r for r in _lines(run_dir / "metrics.jsonl") if "before" in r]


@needs_embedded
def test_sft_without_the_check_before_keeps_its_validation_loss(tmp_path, monkeypatch):
    calls = _counted(monkeypatch, {"accuracy": 0.75, "n": 4, "seconds": 1.0})
    run_dir = tmp_path / "run"
    out = CliRunner().invoke(
        app,
        [
            "sft",
            "--task",
            "arith",
            "--no-eval-before",
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--eval-num-problems",
            "4",
            "--output",
            str(run_dir),
        ],
    )
    assert out.exit_code == 0, out.output
    assert len(calls) == 1  # after training only
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["accuracy_before"] is None and summary["accuracy_after"] == 0.75
    assert summary["val_loss_before"] is not None and summary["val_loss_after"] is not None
    assert summary["line"] == "accuracy not checked before -> 0.75 on 4 held-out problems"
    first = _lines(run_dir / "metrics.jsonl")[0]
    assert (
        first["before"] and first["val_loss"] == summary["val_loss_before"] and first["eval/accuracy"] is None
    )
    assert "accuracy before training: not checked (eval_before: false)" in out.output
    assert "validation loss before training" in out.output and "None" not in out.output


@needs_embedded
def test_a_warm_start_without_the_base_check_still_reports_its_accuracy_after(tmp_path, monkeypatch):
    """The sft stage skips the base's check; its check after its last step (GRPO's starting accuracy) is made,
    and GRPO measures only its final check."""
    calls = _counted(monkeypatch)
    config = build_config(
        {
            "task": "arith",
            "steps": 1,
            "batch_size": 2,
            "group_size": 2,
            "eval_num_problems": 4,
            "lora_rank": 4,
            "warm_start_steps": 2,
            "warm_start_batch_size": 2,
            "eval_before": False,
            "output": str(tmp_path / "run"),
        },
        task_defaults=recommended_settings,
    )
    result = trainer.train(config)
    # the stage's check after its last step (its config writes to run/warm_start), then GRPO's final check
    assert [Path(args[3].output).name for args in calls] == ["warm_start", "run"]
    stage = json.loads((tmp_path / "run" / "warm_start" / "summary.json").read_text())
    assert stage["accuracy_before"] is None and stage["accuracy_after"] is not None
    assert result.accuracy_before is None
    assert result.accuracy_after_warm_start == stage["accuracy_after"] and result.accuracy_after is not None
    w, a = result.accuracy_after_warm_start, result.accuracy_after
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["accuracy_before"] is None and summary["accuracy_after_warm_start"] == w
    assert summary["line"] == (
        f"accuracy not checked before -> {w:.2f} after the warm start -> {a:.2f} "
        f"({a - w:+.2f}) on 4 held-out problems"
    )
    before_row = [r for r in _lines(tmp_path / "run" / "metrics.jsonl") if r.get("before")]
    assert before_row == [{"step": 0, "eval/accuracy": w, "before": True}]
