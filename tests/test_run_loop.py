"""The run loop train and sft share (run/loop.py): sft gets train's time limit, loggers and rank guard."""

import importlib.machinery
import io
import json
import sys
import types

import mlx.core as mx
import numpy as np
import pytest
from rich.console import Console

from mlx_grpo.config import build_config
from mlx_grpo.models.loading import embedded_model_path
from mlx_grpo.run import checkpoint as ckpt
from mlx_grpo.run import distributed as dist
from mlx_grpo.run import loop
from mlx_grpo.run.sft import sft
from mlx_grpo.run.sft_display import SFTDisplay
from mlx_grpo.tasks.registry import recommended_settings

pytestmark = pytest.mark.skipif(
    not (embedded_model_path() / "config.json").exists(),
    reason="the embedded model has not been built (scripts/build_tiny_model.py)",
)

SETTINGS = {"task": "arith", "steps": 4, "batch_size": 2, "eval_num_problems": 4, "save_every": 10}


def _config(**values):
    return build_config({**SETTINGS, **values}, task_defaults=recommended_settings)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sft_stops_at_its_time_limit_and_saves_its_last_step(tmp_path, monkeypatch):
    """Each step seems to take two minutes against a one-minute limit: after step 1, one more step would
    end past the limit, so sft stops there, saves step 1 (save_every is 10), checks and summarises step 1,
    and says so."""
    offset = [0.0]
    real = loop.time.perf_counter

    class Clock:
        @staticmethod
        def perf_counter():
            return real() + offset[0]

    monkeypatch.setattr(loop, "time", Clock)
    events, out = [], io.StringIO()
    display = SFTDisplay(Console(file=out, width=200), live=False)

    def on_event(kind, data):
        events.append((kind, data))
        display(kind, data)
        if kind == "step":
            offset[0] += 120.0

    result = sft(_config(time_limit_minutes=1, output=str(tmp_path / "run")), on_event)
    run_dir = tmp_path / "run"
    assert [d for k, d in events if k == "time_limit"] == [{"step": 1, "total": 4, "minutes": 1}]
    assert "time limit of 1 min: stopping after step 1 of 4" in out.getvalue()
    assert [m["step"] for m in result.history] == [1]
    assert ckpt.latest_checkpoint(run_dir).name == ckpt.checkpoint_name(1)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["val_loss_after"] is not None
    final = _lines(run_dir / "metrics.jsonl")[-1]
    assert final["step"] == 1 and final["final"]
    last = mx.load(str(run_dir / "checkpoints" / ckpt.checkpoint_name(1) / "adapters.safetensors"))
    saved = mx.load(str(run_dir / "adapters.safetensors"))
    assert saved.keys() == last.keys()
    assert all(np.array_equal(np.array(last[k]), np.array(saved[k])) for k in saved)


def test_sft_without_a_limit_runs_every_step(tmp_path, monkeypatch):
    """The same clock with no time_limit_minutes: all four steps, no time_limit event."""
    offset = [0.0]
    real = loop.time.perf_counter

    class Clock:
        @staticmethod
        def perf_counter():
            return real() + offset[0]

    monkeypatch.setattr(loop, "time", Clock)
    events = []

    def on_event(kind, data):
        events.append(kind)
        offset[0] += 120.0 if kind == "step" else 0.0

    result = sft(_config(output=str(tmp_path / "run")), on_event)
    assert [m["step"] for m in result.history] == [1, 2, 3, 4] and "time_limit" not in events


def test_sft_reports_to_the_loggers_it_is_given(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init = lambda **kw: calls.append(("init", kw["name"])) or types.SimpleNamespace(summary={})
    fake.log = lambda values, step: calls.append(("log", step, sorted(values)))
    fake.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    sft(_config(steps=2, report_to=["wandb"], output=str(tmp_path / "run")))
    assert calls[0] == ("init", "run") and calls[-1] == ("finish",)
    logged = [c for c in calls if c[0] == "log"]
    assert [c[1] for c in logged] == [0, 1, 2, 2]  # the check before, two steps, the check after
    assert {"loss", "grad_norm", "lr"} <= set(logged[1][2])


def test_only_the_main_rank_writes_an_sft_run(tmp_path, monkeypatch):
    """Another rank trains the same steps and writes nothing: no run folder, no events."""
    monkeypatch.setattr(dist, "is_main", lambda: False)
    events = []
    result = sft(_config(steps=2, output=str(tmp_path / "run")), lambda kind, data: events.append(kind))
    assert [m["step"] for m in result.history] == [1, 2]
    assert not (tmp_path / "run").exists() and events == []
