"""`mlx-grpo inspect`: a run's settings, first/last/best metrics, health events and
checkpoints, from its files alone, whether it finished, stopped or is still running."""

import json

from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import TrainConfig, dump_yaml
from mlx_grpo.evaluation.inspect_run import summarize
from mlx_grpo.files import training_rows


def fake_run(path, finished=True, stopped=False):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(dump_yaml(TrainConfig(lr=1e-4, steps=10, group_size=4)))
    rewards = [0.2, 0.5, 0.4]
    rows = [
        {"step": s, "reward/mean": r, "reward/best_of_n": 1.0, "grad_norm": 0.1 * s, "kl": None}
        for s, r in enumerate(rewards, 1)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "health.jsonl").write_text(
        json.dumps(
            {
                "step": 3,
                "rule": "zero_std",
                "title": "t",
                "evidence": "75% of groups had identical rewards",
                "suggestion": "s",
            }
        )
        + "\n"
    )
    folder = path / "checkpoints" / "step_000002"
    folder.mkdir(parents=True)
    (folder / "adapters.safetensors").write_bytes(b"x" * 500_000)
    (folder / "state.json").write_text(json.dumps({"step": 2}))
    (folder / "manifest.json").write_text("{}")
    (path / "checkpoints" / "latest").write_text("step_000002\n")
    if finished:
        (path / "summary.json").write_text(
            json.dumps(
                {"stopped": True, "line": "stopped at step 3: NaN"}
                if stopped
                else {
                    "accuracy_before": 0.3,
                    "accuracy_after": 0.6,
                    "eval_n": 50,
                    "line": "accuracy 0.30 -> 0.60",
                }
            )
        )
    return path


def test_summary_of_a_finished_run(tmp_path):
    lines = summarize(fake_run(tmp_path / "run"))
    text = "\n".join(lines)
    assert "finished, 3 of 10 steps: accuracy 0.30 -> 0.60" in text
    assert "lr=0.0001" in text and "group_size=4" in text and "steps=10" in text
    assert "batch_size=" not in text  # unchanged settings are not repeated
    reward = next(line for line in lines if line.strip().startswith("reward/mean"))
    assert reward.split() == ["reward/mean", "0.2", "0.4", "0.3667", "0.5", "at", "step", "2"]
    assert not any(line.strip().startswith("kl ") for line in lines)  # never measured: no row
    assert "accuracy before 0.300, after 0.600 on 50 held-out problems" in text
    assert "health events (1)" in text and "step 3: zero_std: 75% of groups had identical rewards" in text
    assert "checkpoints/step_000002  0.50 MB  (latest)" in text


def test_running_and_stopped_runs(tmp_path):
    running = "\n".join(summarize(fake_run(tmp_path / "running", finished=False)))
    assert "running or interrupted: step 3 of 10, last metrics written" in running
    stopped = "\n".join(summarize(fake_run(tmp_path / "stopped", stopped=True)))
    assert "stopped after step 3 of 10: stopped at step 3: NaN" in stopped


def test_cli_inspect(tmp_path):
    run = fake_run(tmp_path / "run")
    result = CliRunner().invoke(app, ["inspect", str(run)])
    assert result.exit_code == 0 and "health events (1)" in result.output
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "not a run folder" in result.output and "Traceback" not in result.output


def test_inspect_a_real_run(tmp_path, tiny_model_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(20)))
    rewards = tmp_path / "rewards.py"
    rewards.write_text(
        "def variety(prompts, completions, **kw):\n    return [len(set(c)) / 10 for c in completions]\n"
    )
    run = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            str(tiny_model_path),
            "--data",
            str(data),
            "--reward-file",
            str(rewards),
            "--reward",
            "variety",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--group-size",
            "4",
            "--max-tokens",
            "8",
            "--output",
            str(run),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (run / "health.jsonl").is_file()  # written every run, empty when all is well
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(m["reward/min"] <= m["reward/mean"] <= m["reward/max"] for m in training_rows(metrics))
    text = "\n".join(summarize(run))
    assert "finished, 2 of 2 steps" in text and "checkpoints/step_000002" in text and "(latest)" in text
