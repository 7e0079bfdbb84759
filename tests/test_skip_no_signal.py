"""skip_no_signal: a step whose groups carry no signal leaves the weights, Adam's moments and the
lr schedule as they were, and says so in the metrics and the live display."""

import io

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from rich.console import Console

from mlx_grpo.config import build_config
from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.display import TrainDisplay, metrics_table
from mlx_grpo.run.trainer import make_optimizer, train_step
from mlx_grpo.tasks.registry import Task

SIGNAL = {"on": True}


def varied_or_flat(prompts, completions, **kw):
    """Rewards that differ inside a group while SIGNAL is on, all equal once it is off."""
    return [float(sum(map(ord, c)) % 97) if SIGNAL["on"] else 1.0 for c in completions]


def _weights(model):
    return {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}


def _two_steps(tiny_model_path, skip: bool):
    """Step 1 has signal, step 2 none; returns (weights after 1, after 2, metrics of 2, optimizer)."""
    config = build_config(
        {
            "group_size": 4,
            "batch_size": 2,
            "max_tokens": 6,
            "lr": 1e-2,
            "warmup_steps": 0,
            "steps": 4,
            "kl_every": 0,
            "skip_no_signal": skip,
        }
    )
    task = Task(
        "flat",
        [{"prompt": p} for p in ("1+1", "2+2", "3+3", "4+4")],
        [],
        [varied_or_flat],
        [1.0],
        None,
        None,
        [],
    )
    model, tokenizer = load_policy(str(tiny_model_path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4})
    optimizer = make_optimizer(config)
    SIGNAL["on"] = True
    first, _ = train_step(model, tokenizer, optimizer, task, config, 1, None)
    assert not first["update/no_signal"] and first["grad_norm"] > 0
    after_first, lr_first = _weights(model), optimizer.state["learning_rate"].item()
    SIGNAL["on"] = False
    second, _ = train_step(model, tokenizer, optimizer, task, config, 2, None)
    return after_first, _weights(model), second, optimizer, lr_first


def test_a_step_without_signal_moves_nothing_when_skipped(tiny_model_path):
    after_first, after_second, metrics, optimizer, lr_first = _two_steps(tiny_model_path, skip=True)
    assert metrics["update/no_signal"] and metrics["update/skipped"] and metrics["frac_zero_std"] == 1.0
    for name, value in after_first.items():
        np.testing.assert_array_equal(after_second[name], value, err_msg=name)
    assert int(optimizer.state["step"]) == 1  # the schedule did not tick
    assert metrics["lr"] == optimizer.state["learning_rate"].item() == lr_first
    assert metrics["update/rel_change"] == 0.0 and metrics["grad_norm"] == 0.0
    # one optimizer step not taken, counted the same by both names; not a NaN/Inf one
    assert metrics["skipped_updates"] == 1 and metrics["update/nonfinite"] == 0


def test_skipping_is_the_default():
    """Decided by measurement (docs/algorithms.md): on a Qwen run a step without signal moved the
    weights as far as the steps with signal around it."""
    assert build_config({}).skip_no_signal
    assert not build_config({"skip_no_signal": False}).skip_no_signal


def test_without_the_switch_adam_moves_the_weights_on_a_zero_gradient(tiny_model_path):
    """`--no-skip-no-signal`, the old behaviour: AdamW steps on the zero gradient, and its first
    moment from step 1 moves every weight step 1 moved."""
    after_first, after_second, metrics, optimizer, _ = _two_steps(tiny_model_path, skip=False)
    assert metrics["update/no_signal"] and not metrics["update/skipped"] and metrics["skipped_updates"] == 0
    assert metrics["grad_norm"] == 0.0 and metrics["update/rel_change"] > 0
    assert int(optimizer.state["step"]) == 2
    assert any(not np.array_equal(after_second[k], v) for k, v in after_first.items())


def test_the_display_counts_skipped_steps():
    out = io.StringIO()
    display = TrainDisplay(Console(file=out, width=200), live=False)
    base = {"reward/mean": 0.5, "time/step_s": 1.0}
    display.on_step({"metrics": {"step": 1, **base, "update/skipped": False}, "total": 3})
    display.on_step({"metrics": {"step": 2, **base, "update/skipped": True}, "total": 3})
    display.on_step({"metrics": {"step": 3, **base, "update/skipped": True}, "total": 3})
    lines = out.getvalue().splitlines()
    assert "skipped" not in lines[0] and lines[1].endswith("skipped 1") and lines[2].endswith("skipped 2")
    table = io.StringIO()
    Console(file=table, width=200).print(metrics_table(list(display.history), 200, display.skipped))
    assert "skipped" in table.getvalue() and "2" in table.getvalue().split("skipped")[1]
