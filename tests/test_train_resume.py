"""A run interrupted after a checkpoint and resumed ends with the same weights
as the run that was never interrupted; run folders work with mlx-lm."""

import json

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.config import build_config
from mlx_grpo.files import training_rows
from mlx_grpo.run.trainer import train


@pytest.fixture
def custom_run(tiny_model_path, variety_task):
    def make(output, **overrides):
        flags = dict(
            model=str(tiny_model_path),
            **variety_task,
            steps=4,
            batch_size=2,
            group_size=4,
            max_tokens=10,
            lr=1e-2,
            save_every=2,
            micro_batch_size=3,
            num_iterations=2,
            seed=7,
            output=str(output),
            warmup_steps=1,
        )
        flags.update(overrides)
        return build_config(flags)

    return make


class Interrupt(Exception):
    pass


def test_resume_reproduces_uninterrupted_weights(tmp_path, custom_run):
    straight = train(custom_run(tmp_path / "straight"))

    def stop_after_first_checkpoint(kind, data):
        if kind == "checkpoint" and data["step"] == 2:
            raise Interrupt

    interrupted_dir = tmp_path / "interrupted"
    with pytest.raises(Interrupt):
        train(custom_run(interrupted_dir), on_event=stop_after_first_checkpoint)
    # a half-finished step 3 may have written metrics after the checkpoint: resume must drop them
    with open(interrupted_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "loss": 123.0}) + "\n")

    resumed = train(custom_run(interrupted_dir, resume=str(interrupted_dir)))

    a = mx.load(str(straight.run_dir / "adapters.safetensors"))
    b = mx.load(str(resumed.run_dir / "adapters.safetensors"))
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        assert np.array_equal(np.array(a[name]), np.array(b[name])), name  # bitwise on CPU
    # the weights did move away from the initial LoRA state (lora_b starts at zero)
    assert any(np.abs(np.array(v)).max() > 0 for k, v in a.items() if k.endswith("lora_b"))

    def steps(run_dir):
        return [
            json.loads(line)["step"]
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if "final" not in json.loads(line)
        ]

    assert steps(interrupted_dir) == [0, 1, 2, 3, 4]  # the resume did not evaluate before training again
    losses_a = [
        json.loads(x).get("loss") for x in (straight.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    losses_b = [
        json.loads(x).get("loss") for x in (interrupted_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert losses_a == losses_b


def test_the_evaluation_before_training_is_metrics_row_0(tmp_path, custom_run, monkeypatch):
    """Written as soon as it is measured, so an interrupted run keeps it (plot draws it, inspect says it);
    a resume without a checkpoint evaluates again and leaves one step-0 row; it equals summary.json's
    accuracy_before, and inspect counts the training steps from 1."""
    from test_plot import eval_accuracy_points

    from mlx_grpo.evaluation.inspect_run import summarize

    def stop_after_step_1(kind, data):  # before any checkpoint (save_every=2)
        if kind == "step":
            raise Interrupt

    run_dir = tmp_path / "run"
    with pytest.raises(Interrupt):
        train(custom_run(run_dir, steps=2, eval_num_problems=4), on_event=stop_after_step_1)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert (
        [r["step"] for r in rows] == [0, 1] and rows[0]["before"] and not (run_dir / "summary.json").exists()
    )
    before = rows[0]["eval/accuracy"]
    assert eval_accuracy_points(run_dir, tmp_path, monkeypatch) == [(0, before)]
    text = "\n".join(summarize(run_dir))
    assert "running or interrupted: step 1 of 2" in text and f"accuracy before training {before:.3f}" in text

    resumed = train(custom_run(run_dir, steps=2, eval_num_problems=4, resume=str(run_dir)))
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [r["step"] for r in rows] == [0, 1, 2, 2] and rows[-1]["final"]
    assert rows[0] == {"step": 0, "eval/accuracy": summary["accuracy_before"], "before": True}
    assert (
        summary["accuracy_before"] == resumed.accuracy_before == before
    )  # the same weights, evaluated again
    assert eval_accuracy_points(run_dir, tmp_path, monkeypatch) == [
        (0, before),
        (2, summary["accuracy_after"]),
    ]
    lines = summarize(run_dir)
    assert "finished, 2 of 2 steps" in "\n".join(lines)
    reward = next(line.split() for line in lines if line.strip().startswith("reward/mean "))
    assert float(reward[1]) == pytest.approx(
        rows[1]["reward/mean"], rel=1e-3
    )  # first: step 1, not the eval row
    assert not any(
        line.strip().startswith("eval/accuracy") for line in lines
    )  # evaluated only outside training


def test_run_folder_loads_in_mlx_lm(tmp_path, custom_run, tiny_model_path):
    from mlx_lm import generate, load

    from mlx_grpo.models.adapters import prepare_for_training
    from mlx_grpo.models.loading import load_policy

    run = train(custom_run(tmp_path / "run", steps=2))
    config = json.loads((run.run_dir / "adapter_config.json").read_text())
    assert config["model"] == str(tiny_model_path)
    assert config["fine_tune_type"] == "lora"

    # mlx-lm's own loader, as `mlx_lm.generate --model BASE --adapter-path RUN_DIR` uses it
    model, tokenizer = load(str(tiny_model_path), adapter_path=str(run.run_dir))
    text = generate(model, tokenizer, "say 3", max_tokens=6)
    assert isinstance(text, str)

    # ... and it computes exactly what the trained policy computes
    ours, _ = load_policy(str(tiny_model_path))
    prepare_for_training(
        ours, "lora", {"rank": config["lora_parameters"]["rank"], "scale": config["lora_parameters"]["scale"]}
    )
    ours.load_weights(list(mx.load(str(run.run_dir / "adapters.safetensors")).items()), strict=False)
    x = mx.array([[5, 6, 7, 8, 9]])
    # atol 1e-5: our SwiGLU uses the polynomial exp (cpu_math.py), mlx-lm its own; both are float32-exact to
    # ~1e-7 relative
    np.testing.assert_allclose(np.array(model(x)), np.array(ours(x)), atol=1e-5)
    assert not np.allclose(np.array(model(x)), np.array(load(str(tiny_model_path))[0](x)))


REQUIRED_METRICS = [
    "step",
    "reward/mean",
    "reward/std",
    "reward/variety/mean",
    "frac_zero_std",
    "advantage/abs_mean",
    "advantage/max",
    "loss",
    "kl",
    "entropy",
    "clip_fraction",
    "grad_norm",
    "grad_clipped",
    "lr",
    "completion/mean_length",
    "completion/truncated_frac",
    "tokens_per_s",
    "time/rollout_s",
    "time/update_s",
    "time/step_s",
    "memory/peak_gb",
]


def test_metrics_and_completions_files(tmp_path, custom_run):
    run = train(custom_run(tmp_path / "run", steps=3, beta=0.1, num_iterations=1))
    lines = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = training_rows(lines)
    assert [m["step"] for m in steps] == [1, 2, 3]
    for m in steps:
        missing = [k for k in REQUIRED_METRICS if k not in m]
        assert not missing, missing
        assert m["kl"] is not None and m["kl"] >= 0  # beta > 0: measured every step
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-5)  # the first rollout is the reference itself
    assert steps[-1]["kl"] > 0  # and the policy then moved away from it
    records = [json.loads(x) for x in (run.run_dir / "completions.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 2 * 4
    assert {"prompt", "completion", "reward", "rewards", "advantage", "finish_reason"} <= records[0].keys()


def test_full_fine_tuning_keeps_a_frozen_reference(tmp_path, custom_run, tiny_model_path):
    run = train(
        custom_run(tmp_path / "full", steps=3, fine_tune_type="full", beta=0.1, lr=1e-3, num_iterations=1)
    )
    config = json.loads((run.run_dir / "adapter_config.json").read_text())
    assert config["fine_tune_type"] == "full"
    steps = training_rows([json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()])[
        :3
    ]
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-5) and steps[-1]["kl"] > 0
    # mlx-lm loads the full weights as an "adapter" and they differ from the base
    from mlx_lm import load

    tuned, _ = load(str(tiny_model_path), adapter_path=str(run.run_dir))
    base, _ = load(str(tiny_model_path))
    x = mx.array([[5, 6, 7]])
    assert not np.allclose(np.array(tuned(x)), np.array(base(x)))
