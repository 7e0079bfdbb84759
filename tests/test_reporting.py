"""--report-to: optional loggers get every step's numbers; a missing package is one clear config error."""

import importlib.machinery
import sys
import types

import pytest

from mlx_grpo.config import ConfigError, build_config
from mlx_grpo.run.reporting import check_reporters, scalars, with_reporters


def test_missing_or_unknown_logger_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    assert check_reporters([]) is None
    assert "unknown logger 'mlflow'" in check_reporters(["mlflow"])
    with pytest.raises(ConfigError, match=r"--report-to wandb: wandb is not installed \(pip install wandb\)"):
        build_config({"report_to": "wandb"})


def test_scalars_keep_numbers_only():
    assert scalars(
        {
            "step": 3,
            "loss": 0.5,
            "grad_clipped": True,
            "kl": None,
            "reward/x/error_example": "boom",
            "frac_zero_std": 0,
        }
    ) == {"loss": 0.5, "grad_clipped": 1.0, "frac_zero_std": 0.0}


def test_wandb_reporter_receives_steps_and_is_finished(monkeypatch, tmp_path):
    calls = []
    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init = lambda **kw: calls.append(("init", kw["name"])) or types.SimpleNamespace(summary={})
    fake.log = lambda values, step: calls.append(("log", step, values))
    fake.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    config = build_config({"report_to": "wandb", "steps": 2})
    seen = []
    emit = with_reporters(config, lambda kind, data: seen.append(kind))
    emit("start", {"run_dir": str(tmp_path / "my-run")})
    emit("eval", {"when": "before", "accuracy": 0.25})
    emit("step", {"metrics": {"step": 1, "loss": 0.5, "kl": None}})
    emit("end", {})
    assert calls == [
        ("init", "my-run"),
        ("log", 0, {"eval/accuracy": 0.25}),
        ("log", 1, {"loss": 0.5}),
        ("finish",),
    ]
    assert seen == ["start", "eval", "step", "end"]  # the display still gets everything


def test_tensorboard_event_file_from_a_real_run(tmp_path, tiny_model_path):
    pytest.importorskip("tensorboardX")
    import json

    from mlx_grpo.run.trainer import train

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(20)))
    rewards = tmp_path / "rewards.py"
    rewards.write_text(
        "def variety(prompts, completions, **kw):\n    return [len(set(c)) / 10 for c in completions]\n"
    )
    run = train(
        build_config(
            dict(
                model=str(tiny_model_path),
                data=str(data),
                reward_file=str(rewards),
                reward=["variety"],
                steps=2,
                batch_size=2,
                group_size=4,
                max_tokens=8,
                output=str(tmp_path / "run"),
                report_to=["tensorboard"],
            )
        )
    )
    files = list((run.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    blob = files[0].read_bytes()
    assert b"reward/mean" in blob and b"grad_norm" in blob  # tag names are stored as text
