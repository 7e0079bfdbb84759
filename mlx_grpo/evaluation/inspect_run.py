"""`mlx-grpo inspect RUN_DIR`: what a finished or running run did, from its files alone.

Reads config.yaml, metrics.jsonl, health.jsonl, summary.json and checkpoints/;
loads no model. summarize() returns plain lines (the CLI prints them).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..config import TrainConfig
from ..files import training_rows
from ..run import checkpoint as ckpt
from ..run.health import read_events
from .plot import read_run, series

# (label, metric key, show its best (highest) value and the step)
METRICS = (
    ("reward/mean", "reward/mean", True),
    ("reward/best_of_n", "reward/best_of_n", True),
    ("eval/accuracy", "eval/accuracy", True),
    ("kl", "kl", False),
    ("grad_norm", "grad_norm", False),
    ("entropy", "entropy", False),
    ("frac_zero_std", "frac_zero_std", False),
    ("completion/mean_length", "completion/mean_length", False),
    ("completion/truncated_frac", "completion/truncated_frac", False),
    ("loss", "loss", False),
    ("time/step_s", "time/step_s", False),
)


def _status(run_dir: Path, rows: list[dict], config: dict) -> str:
    summary_path = run_dir / "summary.json"
    steps = [r["step"] for r in training_rows(rows) if "step" in r]
    done = max(steps) if steps else 0
    total = config.get("steps", "?")
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        if summary.get("stopped"):
            return f"stopped after step {done} of {total}: {summary.get('line', '')}"
        return f"finished, {done} of {total} steps: {summary.get('line', '')}"
    age = time.time() - (run_dir / "metrics.jsonl").stat().st_mtime
    return f"running or interrupted: step {done} of {total}, last metrics written {_ago(age)} ago"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _settings(config: dict) -> list[str]:
    """Model and task, then every setting that differs from TrainConfig's default."""
    defaults = TrainConfig().flat()
    head = f"  model {config.get('model') or 'embedded tiny-arith'}, task {config.get('task')}"
    changed = [
        f"{k}={v}"
        for k, v in config.items()
        if k not in ("model", "task") and k in defaults and v != defaults[k]
    ]
    lines = [head]
    line = "  changed from defaults:"
    for item in changed:
        if len(line) + len(item) > 96:
            lines.append(line)
            line = "   "
        line += f" {item}"
    lines.append(line if changed else "  changed from defaults: none")
    return lines


def _metric_lines(rows: list[dict]) -> list[str]:
    lines = [f"  {'metric':<26}{'first':>11}{'last':>11}{'mean':>11}  best"]
    for label, key, best in METRICS:
        steps, values = series(training_rows(rows), key)
        if not values:
            continue
        best_text = ""
        if best:
            i = int(np.argmax(values))
            best_text = f"{values[i]:.4g} at step {steps[i]}"
        lines.append(
            f"  {label:<26} {values[0]:>10.4g} {values[-1]:>10.4g} {np.mean(values):>10.4g}  {best_text}"
        )
    return lines


def _checkpoint_lines(run_dir: Path) -> list[str]:
    root = run_dir / ckpt.CHECKPOINTS
    folders = sorted(p for p in root.glob("step_*") if p.is_dir()) if root.is_dir() else []
    if not folders:
        return ["  none"]
    pointer = (root / "latest").read_text().strip() if (root / "latest").is_file() else None
    best = ckpt.best_checkpoint(run_dir)
    lines = []
    for folder in folders:
        size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        tags = [t for t, hit in (("latest", folder.name == pointer), ("best eval", folder == best)) if hit]
        if not (folder / ckpt.MANIFEST).is_file():
            tags.append("no manifest: unfinished, or written before manifests")
        state = json.loads((folder / "state.json").read_text()) if (folder / "state.json").is_file() else {}
        metric = state.get("eval_metric")
        extra = f", eval {metric:.3f}" if isinstance(metric, (int, float)) else ""
        lines.append(
            f"  {folder.relative_to(run_dir)}  {size / 1e6:.2f} MB{extra}"
            + (f"  ({'; '.join(tags)})" if tags else "")
        )
    return lines


def summarize(run_dir: str | Path) -> list[str]:
    """The summary of a run folder, as lines of text. Raises PlotError if it is not a run folder."""
    run_dir = Path(run_dir)
    rows, config = read_run(run_dir)
    lines = [f"run {run_dir}", f"  {_status(run_dir, rows, config)}", "", "settings", *_settings(config)]
    lines += ["", "metrics", *_metric_lines(rows)]
    before, final = [r for r in rows if r.get("before")], [r for r in rows if r.get("final")]
    summary = (
        json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    )
    if summary.get("accuracy_before") is not None:
        lines.append(
            f"  accuracy before {summary['accuracy_before']:.3f}, after "
            f"{_fmt(summary.get('accuracy_after'))} on {summary.get('eval_n')} held-out problems"
        )
    elif before or final:  # no summary yet: running or interrupted
        said = [f"accuracy before training {_fmt(before[-1].get('eval/accuracy'))}"] if before else []
        said += [f"final accuracy {_fmt(final[-1].get('eval/accuracy'))}"] if final else []
        lines.append("  " + ", ".join(said))
    events = read_events(run_dir)
    lines += ["", f"health events ({len(events)})"]
    lines += [f"  step {e.get('step')}: {e.get('rule')}: {e.get('evidence')}" for e in events] or ["  none"]
    lines += ["", "checkpoints", *_checkpoint_lines(run_dir)]
    return lines


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"
