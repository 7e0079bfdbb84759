"""`mlx-grpo plot`: a PNG with the expected panels, runs overlaid; one clear line without matplotlib."""

import json
import struct
import sys

import pytest
import yaml
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.evaluation.plot import PANELS, plot_runs

TITLES = [
    "reward",
    "eval accuracy",
    "KL to reference",
    "grad norm",
    "entropy",
    "completion length",
    "truncated fraction",
    "learning rate",
]


def fake_run(path, max_grad_norm=1.0, steps=6, accuracy_before=0.25):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        yaml.safe_dump({"steps": steps, "max_grad_norm": max_grad_norm, "lr": 1e-4})
    )
    rows = [
        {
            "step": s,
            "reward/mean": 0.1 * s,
            "reward/best_of_n": 0.2 * s,
            "kl": 0.01 * s if s % 3 == 0 else None,
            "grad_norm": 0.5 + s,
            "entropy": 1.0 / s,
            "completion/mean_length": 10.0 + s,
            "completion/truncated_frac": 0.0,
            "lr": 1e-4,
            "skipped_updates": 0,
        }
        for s in range(1, steps + 1)
    ]
    rows[2]["eval/accuracy"] = 0.4
    rows.append({"step": steps, "eval/accuracy": 0.5, "final": True})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(
        json.dumps({"accuracy_before": accuracy_before, "accuracy_after": 0.5})
    )
    return path


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_plot_has_the_panels_and_overlays_runs(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    captured = {}
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (captured.setdefault("fig", fig), real_close(fig)))
    a, b = fake_run(tmp_path / "a"), fake_run(tmp_path / "b", max_grad_norm=0.5, steps=4)
    (b / "health.jsonl").write_text(json.dumps({"step": 2, "rule": "zero_std"}) + "\n")
    out = tmp_path / "out" / "ab.png"
    drawn = plot_runs([a, b], out)
    assert list(drawn) == TITLES == [title for title, _ in PANELS]
    assert png_size(out) == (18 * 80, 8 * 80)
    assert drawn["reward"] == ["a mean", "a best-of-N", "b mean", "b best-of-N", "health warning (b)"]
    assert drawn["grad norm"] == ["a", "clip 1 (a)", "b", "clip 0.5 (b)"]
    assert drawn["eval accuracy"] == ["a", "b"]

    axes = {ax.get_title(): ax for ax in captured["fig"].axes}
    accuracy = axes["eval accuracy"].get_lines()[0]
    # before training (step 0, from summary.json), at step 3, and the final evaluation
    assert list(accuracy.get_xdata()) == [0, 3, 6] and list(accuracy.get_ydata()) == [0.25, 0.4, 0.5]
    kl = axes["KL to reference"].get_lines()[0]
    assert list(kl.get_xdata()) == [3, 6]  # None (not measured) is left out, not drawn as 0
    assert list(axes["reward"].get_lines()[1].get_ydata()) == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.2])


def eval_accuracy_points(run_dir, tmp_path, monkeypatch) -> list[tuple[int, float]]:
    """(step, accuracy) of the eval accuracy line `plot` draws for one run."""
    import matplotlib.pyplot as plt

    captured = {}
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (captured.setdefault("fig", fig), real_close(fig)))
    plot_runs([run_dir], tmp_path / "plot.png")
    ax = next(ax for ax in captured["fig"].axes if ax.get_title() == "eval accuracy")
    return [(x, y) for line in ax.get_lines() for x, y in zip(line.get_xdata(), line.get_ydata())]


def test_the_step_0_row_is_drawn_once_with_or_without_a_summary(tmp_path, monkeypatch):
    """metrics.jsonl's step-0 row (the evaluation before training) is the before point; summary.json's
    accuracy_before is used only for runs written before that row existed, never twice."""
    pytest.importorskip("matplotlib")
    run = fake_run(tmp_path / "run", accuracy_before=0.25)
    lines = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "eval/accuracy": 0.25, "before": True}) + "\n" + lines
    )
    assert eval_accuracy_points(run, tmp_path, monkeypatch) == [(0, 0.25), (3, 0.4), (6, 0.5)]
    (run / "summary.json").unlink()  # interrupted: no summary, the row alone
    assert eval_accuracy_points(run, tmp_path, monkeypatch) == [(0, 0.25), (3, 0.4), (6, 0.5)]


def test_cli_plot_default_output_and_errors(tmp_path, monkeypatch):
    import mlx_grpo.evaluation.plot

    calls = []
    monkeypatch.setattr(
        mlx_grpo.evaluation.plot, "plot_runs", lambda dirs, output: calls.append((dirs, output))
    )
    run = fake_run(tmp_path / "run")
    result = CliRunner().invoke(app, ["plot", str(run)])
    assert result.exit_code == 0, result.output
    assert calls == [([run], run / "plot.png")] and f"wrote {run / 'plot.png'}" in result.output
    result = CliRunner().invoke(app, ["plot", str(run), str(run), "--output", str(tmp_path / "x.png")])
    assert calls[-1] == ([run, run], tmp_path / "x.png")
    monkeypatch.undo()
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "not a run folder" in result.output and "Traceback" not in result.output


def test_without_matplotlib_one_clear_line(tmp_path, monkeypatch):
    run = fake_run(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = CliRunner().invoke(app, ["plot", str(run)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: plot needs matplotlib: pip install 'mlx-grpo[plot]'"
    ]
