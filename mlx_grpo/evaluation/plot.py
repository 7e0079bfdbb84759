"""`mlx-grpo plot`: one PNG of a run's curves, several runs overlaid.

Reads RUN_DIR/metrics.jsonl (and config.yaml for the clip limit; summary.json for the accuracy
before training of runs whose metrics.jsonl has no step-0 row). matplotlib
is optional (`pip install 'mlx-grpo[plot]'`); without it plot_runs raises
PlotError with the install line.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ..run.health import read_events

# (title, [(metric key, label suffix, line style)]) in panel order.
PANELS = (
    ("reward", [("reward/mean", "mean", "-"), ("reward/best_of_n", "best-of-N", "--")]),
    ("eval accuracy", [("eval/accuracy", "", "o-")]),
    ("KL to reference", [("kl", "", "o-")]),
    ("grad norm", [("grad_norm", "", "-")]),
    ("entropy", [("entropy", "", "-")]),
    ("completion length", [("completion/mean_length", "", "-")]),
    ("truncated fraction", [("completion/truncated_frac", "", "-")]),
    ("learning rate", [("lr", "", "-")]),
)


class PlotError(ValueError):
    """A run folder or environment problem; the message is one line for the user."""


def read_run(run_dir: str | Path) -> tuple[list[dict], dict]:
    """(metrics rows, settings) of a run folder."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise PlotError(f"{run_dir}: not a run folder (no metrics.jsonl)")
    rows, lines = [], path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if n < len(lines):
                    raise PlotError(f"{path}: line {n} is not JSON") from None
                # the last line of a run still writing it: leave it out
    config_path = run_dir / "config.yaml"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    return rows, config or {}


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of a metric, skipping steps where it is missing or None."""
    points = [
        (r["step"], float(r[key]))
        for r in rows
        if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) and "step" in r
    ]
    return [s for s, _ in points], [v for _, v in points]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("plot needs matplotlib: pip install 'mlx-grpo[plot]'") from None
    return plt


def plot_runs(run_dirs: list[str | Path], output: str | Path) -> dict[str, list[str]]:
    """Draw the panels for every run into `output` (PNG).

    Returns {panel title: labels of its lines}, panels in order (what was drawn, for tests).
    """
    runs = [(Path(d).name or str(d), *read_run(d)) for d in run_dirs]
    for (_, rows, _), run_dir in zip(runs, run_dirs):
        # measured before step 1, drawn at step 0: metrics.jsonl's step-0 row; a run written before that
        # row existed has it in summary.json only
        if any("before" in r for r in rows):
            continue
        before = _accuracy_before(Path(run_dir))
        if before is not None:
            rows.insert(0, {"step": 0, "eval/accuracy": before})
    warnings = [[e["step"] for e in read_events(d) if isinstance(e.get("step"), int)] for d in run_dirs]
    plt = _pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    fig.subplots_adjust(left=0.04, right=0.99, top=0.92, bottom=0.07, wspace=0.25, hspace=0.3)  # fixed: fast
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, lines) in zip(axes.flat, PANELS):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        for i, (name, rows, config) in enumerate(runs):
            color = colors[i % len(colors)]
            for key, suffix, style in lines:
                steps, values = series(rows, key)
                if steps:
                    label = f"{name} {suffix}".strip() if len(runs) > 1 or suffix else name
                    ax.plot(steps, values, style, color=color, label=label, markersize=3)
            if title == "reward" and warnings[i]:  # where health warnings fired (health.jsonl), at the bottom
                ax.plot(
                    warnings[i],
                    [0.02] * len(warnings[i]),
                    "^",
                    color=color,
                    transform=ax.get_xaxis_transform(),
                    label="health warning" + (f" ({name})" if len(runs) > 1 else ""),
                )
            if title == "grad norm" and config.get("max_grad_norm") is not None:
                ax.axhline(
                    float(config["max_grad_norm"]),
                    color=color,
                    linestyle=":",
                    linewidth=1,
                    label=f"clip {config['max_grad_norm']:g}" + (f" ({name})" if len(runs) > 1 else ""),
                )
        if title in ("grad norm", "KL to reference") and _positive(ax):
            ax.set_yscale("log")  # spikes span orders of magnitude
        if ax.has_data():
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.suptitle(" vs ".join(name for name, _, _ in runs))
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=80)
    drawn = {ax.get_title(): [line.get_label() for line in ax.get_lines()] for ax in axes.flat}
    plt.close(fig)
    return drawn


def _accuracy_before(run_dir: Path) -> float | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text(encoding="utf-8")).get("accuracy_before") if path.is_file() else None


def _positive(ax) -> bool:
    """Every plotted value is > 0 and they span more than a factor of 100 (worth a log scale)."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata() if line.get_linestyle() != ":"]
    return bool(ys) and min(ys) > 0 and max(ys) / min(ys) > 100
