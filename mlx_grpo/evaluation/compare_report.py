"""How a comparison is shown: the terminal table and verdict, report.md, report.json,
rows.jsonl and the reward chart. Running it is compare.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from .compare import CompareError, Report
from ..stats import CONFIDENCE, PairedResult


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _ci(p: PairedResult) -> str:
    return "-" if p.ci is None else f"{p.ci[0]:+.2f}..{p.ci[1]:+.2f}"


def _p(value: float) -> str:
    return f"{value:.3g}" if value >= 1e-4 else f"{value:.1e}"


def table_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The report as a table: (header, rows) shared by the terminal and report.md."""
    models = report.data["models"]
    names = list(models)
    header = ["", *names]
    paired = report.paired
    if paired:
        header += ["diff", f"{int(CONFIDENCE * 100)}% CI", "p", "W/L/T"]

    def line(label: str, key: Callable[[dict], float | None], spec: str = ".3f", test: str | None = None):
        values = [key(models[n]) for n in names]
        row = [label, *[_fmt(v, spec) for v in values]]
        if paired:
            if test is not None and test in paired:
                p = paired[test]
                row += [f"{p.difference:+.3f}", _ci(p), _p(p.p_value), f"{p.wins}/{p.losses}/{p.ties}"]
            elif None not in values and len(values) == 2:
                row += [f"{values[1] - values[0]:+{spec}}", "", "", ""]
            else:
                row += ["", "", "", ""]
        return row

    rows = []
    first = models[names[0]]
    if first["accuracy"] is not None:
        rows.append(line("accuracy", lambda m: m["accuracy"], test="accuracy"))
    rows.append(line("mean reward", lambda m: m["reward"], test="reward"))
    for part in first["reward_parts"]:
        rows.append(
            line(
                f"  {part}",
                lambda m, part=part: m["reward_parts"].get(part),
                test="judge" if part == "judge" else None,
            )
        )
    if "judge" in first["reward_parts"]:  # answers the parser could not read: no judge score, not a zero
        unreadable = {r.name: float(np.mean([v is None for v in r.parts["judge"]])) for r in report.results}
        rows.append(line("  judge unreadable", lambda m: unreadable[m["name"]]))
    for k in first.get("pass_at_k", {}):
        rows.append(line(f"pass@{k}", lambda m, k=k: m["pass_at_k"][k]))
    if "best_of_n_reward" in first:
        rows.append(line(f"best-of-{report.data['samples']} reward", lambda m: m["best_of_n_reward"]))
    for key in first.get("episode", {}):  # turns and, for tool episodes, calls and their failures
        # numbers only: tools/unreadable_example is a piece of text
        if key == "episode/turns" or (
            key.startswith("tools/") and not isinstance(first["episode"][key], str)
        ):
            rows.append(
                line(
                    key.split("/", 1)[1].replace("_", " "),
                    lambda m, key=key: m.get("episode", {}).get(key),
                    ".2f",
                )
            )
    # Where the answers stopped on the task's grading ladder (ocaml), each stage some model reached.
    for stage in [s for s in first.get("stages", {}) if any(models[n]["stages"][s] for n in names)]:
        rows.append(line(f"stage {stage}", lambda m, stage=stage: m["stages"][stage]))
    rows.append(line("length (tokens)", lambda m: m["mean_length"], ".1f"))
    rows.append(line("truncated", lambda m: m["truncated_frac"]))
    rows.append(line("tokens/s", lambda m: m["tokens_per_s"], ".0f"))
    return header, rows


def verdict(report: Report) -> str | None:
    """One sentence: does the trained model beat the base, and how sure is that."""
    if not report.paired:
        return None
    d = report.data
    p = report.paired[d["metric"]]
    if p.significant:
        word = "better" if p.difference > 0 else "worse"
        head = f"trained is {word} than base"
    else:
        head = "no significant difference between trained and base"
    ci = f"{p.ci[0]:+.3f} to {p.ci[1]:+.3f}" if p.ci else "-"
    return (
        f"{head}: {d['metric']} {p.difference:+.3f} ({int(p.confidence * 100)}% CI {ci}), "
        f"{p.test} p = {_p(p.p_value)}; won {p.wins}, lost {p.losses}, tied {p.ties} of {p.n} prompts"
    )


def settings_line(report: Report) -> str:
    d = report.data
    how = "greedy" if d["temperature"] == 0 else f"temperature {d['temperature']:g}"
    prompt = f", system prompt {d['system_prompt']!r}" if d.get("system_prompt") else ""
    return (
        f"task {d['task']} ({d['split']} split), {d['n']} prompts x {d['samples']} sample(s), {how}, "
        f"max_tokens {d['max_tokens']}, seed {d['seed']}{prompt}"
    )


def markdown(report: Report) -> str:
    header, rows = table_rows(report)
    d = report.data
    lines = ["# mlx-grpo " + ("compare" if report.paired else "eval"), "", settings_line(report), ""]
    for r in report.results:
        reused = f" (reused answers made by {r.cached_by}, from the cache)" if r.cached else ""
        lines.append(f"- **{r.name}**: `{r.spec.label}`{reused}")
    lines.append("")
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + " --- |" * len(header))
    for row in rows:
        lines.append(
            "| "
            + " | ".join(c.strip() if i else c.replace("  ", "&nbsp;&nbsp;") for i, c in enumerate(row))
            + " |"
        )
    if report.paired:
        lines += [
            "",
            verdict(report) + ".",
            "",
            "Paired over prompts (each prompt's mean over its samples): the difference is trained - base; "
            "the CI is a percentile bootstrap over prompts; p is McNemar's exact test for right/wrong "
            "answers with one sample a prompt, the Wilcoxon signed-rank test otherwise; W/L/T counts the "
            "prompts where trained scored higher, lower, the same.",
        ]
    for w in d["warnings"]:
        lines += ["", f"warning: {w}"]
    lines += ["", f"{d['seconds']:.1f} s in all."]
    return "\n".join(lines) + "\n"


def prompt_records(report: Report) -> list[dict]:
    """One record a prompt: its text, columns, and each model's completions and rewards."""
    k = report.data["samples"]
    records = []
    for i, row in enumerate(report.rows):
        record = {
            "index": i,
            "prompt": row["prompt"],
            "columns": {c: v for c, v in row.items() if c != "prompt"},
        }
        for r in report.results:
            span = slice(i * k, (i + 1) * k)
            record[r.name] = {
                "completions": [a.text for a in r.answers[span]],
                "rewards": [float(x) for x in r.rewards[span]],
                "parts": {name: values[span] for name, values in r.parts.items()},
                "accuracies": None if r.accuracy is None else [float(x) for x in r.accuracy[span]],
                "finish_reasons": [a.finish_reason for a in r.answers[span]],
                "stages": None if r.stages is None else r.stages[span],
                "reward": float(r.rewards[span].mean()),
                "accuracy": None if r.accuracy is None else float(r.accuracy[span].mean()),
            }
        if report.paired:
            # The outcome follows the report's headline metric, so the rows add up to its W/L/T.
            metric = report.data["metric"]
            diff = record["trained"][metric] - record["base"][metric]
            record["difference"] = diff
            record["outcome"] = "won" if diff > 0 else "lost" if diff < 0 else "tied"
        records.append(record)
    return records


def plot(report: Report, path: Path) -> bool:
    """A PNG of the per-prompt reward distributions; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    values = [r.per_prompt(r.rewards) for r in report.results]
    distinct = np.unique(np.concatenate(values))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(values)
    if len(distinct) <= 12:  # few reward levels (right/wrong): one group of bars a level
        for i, (r, v) in enumerate(zip(report.results, values)):
            counts = [(v == level).sum() for level in distinct]
            ax.bar(
                np.arange(len(distinct)) + (i - (len(values) - 1) / 2) * width,
                counts,
                width=width,
                label=f"{r.name}: mean {v.mean():.3f}",
            )
        ax.set_xticks(np.arange(len(distinct)), [f"{level:g}" for level in distinct])
    else:
        edges = np.histogram_bin_edges(distinct, bins=20)
        step = edges[1] - edges[0]
        for i, (r, v) in enumerate(zip(report.results, values)):
            counts, _ = np.histogram(v, bins=edges)
            ax.bar(
                edges[:-1] + step * (0.1 + i * width),
                counts,
                width=step * width,
                align="edge",
                label=f"{r.name}: mean {v.mean():.3f}",
            )
    ax.set_xlabel("reward (per prompt" + (", mean of samples)" if report.data["samples"] > 1 else ")"))
    ax.set_ylabel("prompts")
    ax.set_title(f"{report.data['task']}: reward distribution over {report.data['n']} prompts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(report: Report, folder: Path, chart: bool = True) -> list[Path]:
    """report.json, report.md, rows.jsonl (and rewards.png) in `folder`; returns what was written."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        written = [folder / "report.json", folder / "report.md", folder / "rows.jsonl"]
        written[0].write_text(json.dumps(report.data, indent=2, default=str) + "\n", encoding="utf-8")
        written[1].write_text(markdown(report), encoding="utf-8")
        with open(written[2], "w", encoding="utf-8") as f:
            for record in prompt_records(report):
                f.write(json.dumps(record, default=str) + "\n")
        if chart and plot(report, folder / "rewards.png"):
            written.append(folder / "rewards.png")
    except OSError as e:
        raise CompareError(f"could not write the report to {folder}: {e.strerror or e}") from None
    return written


class Progress:
    """A progress bar per model on a terminal; one line per model elsewhere."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        from ..sampling.progress import PROGRESS

        self.console = console
        self.bar = None
        self.tasks = {}
        self.printed = {}  # model -> when (in its decode's seconds) a log last got its line
        self.decoding = None  # the model whose rollout PROGRESS reports on now
        # A caller's own listener (a notebook's) is put back by stop(), not dropped.
        self.callers_listener = PROGRESS.get()
        PROGRESS.set(self.rollout_moved)
        if console.is_terminal:
            self.bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TextColumn("prompts"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            self.bar.start()

    def __call__(self, name: str, done: int, total: int) -> None:
        self.decoding = name
        if self.bar is not None:
            if name not in self.tasks:
                self.tasks[name] = self.bar.add_task(f"{name}: generating", total=total)
            self.bar.update(self.tasks[name], completed=done)
        elif done == 0:
            self.console.print(f"{name}: generating for {total} prompts ...", highlight=False)

    def rollout_moved(self, state: dict) -> None:
        if self.decoding is not None:
            self.turn(self.decoding, state)

    def turn(self, name: str, state: dict) -> None:
        """A rollout moved on (a turn ended, or a decode's steps): the bar says where it is; elsewhere
        one line a turn, or a decode's line every LOG_ROLLOUT_EVERY_S."""
        from ..run.display import LOG_ROLLOUT_EVERY_S, rollout_line

        if self.bar is not None:
            if name in self.tasks:
                self.bar.update(self.tasks[name], description=f"{name}: {rollout_line(state)}")
        elif state.get("kind") != "decode" or not (
            0 < state["seconds"] - self.printed.get(name, -1e9) < LOG_ROLLOUT_EVERY_S
        ):
            self.printed[name] = state["seconds"]
            self.console.print(f"{name}: {rollout_line(state)}", highlight=False)

    def stop(self) -> None:
        from ..sampling.progress import PROGRESS

        PROGRESS.set(self.callers_listener)
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def print_report(report: Report, console, written: list[Path] = ()) -> None:
    """The rich table, the verdict, and where the files went."""
    from rich import box
    from rich.table import Table
    from rich.markup import escape

    header, rows = table_rows(report)
    table = Table(box=box.SIMPLE_HEAD)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    for r in report.results:
        console.print(f"[bold]{r.name}[/]: {escape(r.spec.label)}", highlight=False, soft_wrap=True)
        if r.cached:  # said, so that nobody takes the decode time for a new measurement
            console.print(
                f"  reused answers made by {escape(str(r.cached_by))}: answers from the cache "
                f"{escape(str(r.cached))} (decoded earlier in {r.seconds:.0f} s; --no-cache decodes again)",
                highlight=False,
                soft_wrap=True,
            )
    # Plain text: a system prompt's "[n]" or "search[query]" is not rich markup.
    console.print(settings_line(report), highlight=False, soft_wrap=True, markup=False)
    console.print(table)
    line = verdict(report)
    if line:
        style = "bold green" if report.paired[report.data["metric"]].significant else "bold"
        console.print(f"[{style}]{line}[/]", highlight=False, soft_wrap=True)
    for r in report.results:
        for name, count in r.errors.items():
            console.print(
                f"[yellow]warning:[/] {r.name}: reward {name} failed {count} time(s): "
                f"{r.error_examples.get(name, '')}",
                highlight=False,
                soft_wrap=True,
            )
    for w in report.data["warnings"]:
        console.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
    if written:
        names = ", ".join(p.name for p in written)
        console.print(
            f"report: {names} in {written[0].parent}  ({report.data['seconds']:.1f} s)",
            highlight=False,
            soft_wrap=True,
        )
