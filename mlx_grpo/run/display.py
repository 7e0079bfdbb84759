"""The live terminal view of a training run (rich).

On a terminal: a progress bar with ETA, a compact table of the key metrics
with trend arrows, and the latest step's best completion with its reward.
Elsewhere (CI, a log file): one plain line every `log_every` steps.
Either way a health warning (see health.py) is printed once, when it fires.
"""

from __future__ import annotations

from collections import deque

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

# The live table: (column title, metric key, format).
TABLE = (
    ("reward", "reward/mean", ".3f"),
    ("best-of-N", "reward/best_of_n", ".2f"),
    ("eval acc", "eval/accuracy", ".3f"),
    ("kl", "kl", ".4f"),
    ("grad", "grad_norm", ".3f"),
    ("entropy", "entropy", ".3f"),
    ("zero-std", "frac_zero_std", ".2f"),
    ("length", "completion/mean_length", ".1f"),
    ("trunc", "completion/truncated_frac", ".2f"),
    ("lr", "lr", ".1e"),
    ("tok/s", "tokens_per_s", ".0f"),
)
# Metrics measured only on some steps: the table shows their last value.
_STICKY = ("kl", "eval/accuracy")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def step_summary(m: dict) -> str:
    return (
        f"reward {_fmt(m.get('reward/mean'), '.3f')} ± {_fmt(m.get('reward/std'), '.3f')}  "
        f"best {_fmt(m.get('reward/best_of_n'), '.2f')}  kl {_fmt(m.get('kl'), '.4f')}  "
        f"grad {_fmt(m.get('grad_norm'), '.3f')}{'*' if m.get('grad_clipped') else ''}  "
        f"len {_fmt(m.get('completion/mean_length'), '.1f')}  tok/s {_fmt(m.get('tokens_per_s'), '.0f')}"
    )


def rollout_line(state: dict) -> str:
    """Where a rollout is (sampling/progress.py): a decode's completions done, tokens/s and the most time
    left; a multi-turn rollout's turn, episodes playing, tokens/s."""
    if state.get("kind") == "decode":
        return (
            f"{state['done']} of {state['rows']} completions done, token {state['position']}/"
            f"{state['max_tokens']}, {state['tokens_per_s']:.0f} tok/s, at most "
            f"{_duration(state['at_most_left_s'])} "
            f"left"
        )
    return (
        f"turn {state['turn']}/{state['max_turns']}, {state['playing']} of {state['episodes']} episodes "
        "playing, "
        f"{state['finished']} done, {state['tokens_per_s']:.0f} tok/s"
    )


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


# A log (no live view) gets a rollout's line at most this often.
LOG_ROLLOUT_EVERY_S = 15.0
# What an evaluation event marked not_checked prints: eval_before: false skipped the check before training.
NOT_CHECKED = "accuracy before training: not checked (eval_before: false)"


def trend(values: list[float], k: int = 5, tolerance: float = 0.05) -> str:
    """↑, ↓ or → comparing the mean of the last k values with the k before.

    A change under `tolerance` of the larger magnitude is flat (→); with fewer
    than two values there is no trend ("").
    """
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return ""
    k = min(k, len(values) // 2)
    before, now = sum(values[-2 * k : -k]) / k, sum(values[-k:]) / k
    if abs(now - before) <= tolerance * max(abs(now), abs(before)):
        return "→"
    return "↑" if now > before else "↓"


def metrics_table(history: list[dict], width: int = 120, skipped: int = 0) -> Table:
    """The latest value of each key metric and its trend; as many rows as `width` needs.

    `skipped`: the steps so far whose optimizer step was skipped for want of signal (skip_no_signal)."""
    per_row = max(3, width // 10)  # a cell is about 10 characters wide
    table = Table(box=None, padding=(0, 1), show_edge=False, show_header=False)
    latest = history[-1] if history else {}
    cells = []
    for title, key, spec in TABLE:
        values = [m.get(key) for m in history]
        value = latest.get(key)
        if value is None and key in _STICKY:
            value = next((v for v in reversed(values) if v is not None), None)
        cells.append((title, f"{_fmt(value, spec)} {trend(values)}".rstrip()))
    if skipped:
        cells.append(("skipped", str(skipped)))
    for _ in range(min(per_row, len(cells))):
        table.add_column(justify="right")
    for start in range(0, len(cells), per_row):
        chunk = cells[start : start + per_row]
        pad = [""] * (per_row - len(chunk)) if start else []
        table.add_row(*[Text(t, style="dim") for t, _ in chunk], *pad)
        table.add_row(*[v for _, v in chunk], *pad)
    return table


def sample_panel(records: list[dict], width: int = 100, lines: int = 6) -> Panel | None:
    """The step's best-rewarded completion, its prompt on one line."""
    if not records:
        return None
    best = max(records, key=lambda r: r.get("reward") if r.get("reward") is not None else float("-inf"))
    prompt = " ".join(str(best.get("prompt", "")).split())
    text = Text(prompt[: width - 10] + ("…" if len(prompt) > width - 10 else ""), style="dim")
    body = str(best.get("completion", "")).strip().splitlines() or [""]
    text.append("\n" + "\n".join(body[:lines]) + ("\n…" if len(body) > lines else ""))
    return Panel(
        text,
        title=f"step {best.get('step')}: best sample, reward {_fmt(best.get('reward'), '.3f')}",
        title_align="left",
        width=width,
    )


def health_lines(event: dict) -> tuple[str, str]:
    """A health event as two lines: what fired with its evidence, and what to do."""
    return (
        f"health: step {event['step']}: {event['title']}: {event['evidence']}",
        f"  suggestion: {event['suggestion']}",
    )


class TrainDisplay:
    """Receives the trainer's events (see trainer.train's on_event)."""

    def __init__(self, console: Console | None = None, log_every: int = 1, live: bool | None = None):
        self.console = console or Console()
        self.log_every = log_every
        self.rollout_printed = 0.0  # when (in the rollout's own seconds) a log last got a rollout line
        self.use_live = self.console.is_terminal if live is None else live
        self.progress = None
        self.live = None
        self.task_id = None
        self.history: deque[dict] = deque(maxlen=20)
        self.sample = None
        self.last_kl = None  # KL is not measured every step when beta = 0
        self.skipped = 0  # steps whose optimizer step was skipped: no group carried signal (skip_no_signal)

    def __call__(self, kind: str, data: dict) -> None:
        getattr(self, f"on_{kind}", lambda d: None)(data)

    def on_start(self, d):
        c = d["config"]
        self.console.print(
            f"[bold]mlx-grpo[/] task [cyan]{c.task}[/] model [cyan]{c.model or 'embedded tiny-arith'}[/] "
            f"-> {d['run_dir']}",
            soft_wrap=True,
        )
        for note in d.get("notes", []):
            self.console.print(note, soft_wrap=True, highlight=False, markup=False)
        for w in d["warnings"]:
            self.console.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
        if d["resumed_from"]:
            self.console.print(f"resuming after step {d['resumed_from']}")
        if self.use_live:
            self.progress = Progress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(bar_width=30),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[rate]}"),
                TextColumn("{task.fields[rollout]}", style="dim"),
                console=self.console,
            )
            self.task_id = self.progress.add_task(
                "train", total=c.steps, completed=d["resumed_from"], rate="", rollout=""
            )
            self.live = Live(self._view(), console=self.console, refresh_per_second=4, transient=False)
            self.live.start()

    def _view(self):
        parts = [self.progress]
        if self.history:
            parts.append(metrics_table(list(self.history), self.console.width, self.skipped))
        if self.sample is not None:
            parts.append(self.sample)
        return Group(*parts)

    def on_eval(self, d):
        if d["when"] == "after":
            self.stop()  # the finished view stays above the final numbers
        if d.get("not_checked"):
            self.console.print(NOT_CHECKED, highlight=False)
        if d.get("accuracy") is None:
            return
        label = {"before": "before training", "after": "after training"}.get(
            d["when"], f"at step {d['when']}"
        )
        self.console.print(
            f"accuracy {label}: {d['accuracy']:.3f} on {d['n']} held-out problems ({d['seconds']:.1f}s)"
        )

    def on_rollout(self, state):
        """Where a rollout (or an evaluation's decode) is: the live view's bar; without one (a log, or the
        evaluation before training) a line every LOG_ROLLOUT_EVERY_S."""
        if self.live is not None:
            self.progress.update(self.task_id, rollout=rollout_line(state))
        elif (
            state["seconds"] - self.rollout_printed >= LOG_ROLLOUT_EVERY_S
            or state["seconds"] < self.rollout_printed
        ):
            self.rollout_printed = state["seconds"]
            self.console.print(f"  {rollout_line(state)}", highlight=False, soft_wrap=True)

    def on_step(self, d):
        m = d["metrics"]
        if m.get("kl") is not None:
            self.last_kl = m["kl"]
        self.skipped += bool(m.get("update/skipped"))
        self.history.append(m)
        if self.live is not None:
            self.sample = sample_panel(d.get("records") or [], width=min(self.console.width, 100))
            self.progress.update(
                self.task_id,
                completed=m["step"],
                rate=f"{_fmt(m.get('time/step_s'), '.2f')}s/step",
                rollout="",
            )
            self.live.update(self._view())
        elif m["step"] % self.log_every == 0 or m["step"] == d["total"]:
            m = {**m, "kl": self.last_kl}
            skipped = f"  skipped {self.skipped}" if self.skipped else ""
            self.console.print(
                f"step {m['step']}/{d['total']}  {step_summary(m)}  "
                f"{_fmt(m.get('time/step_s'), '.2f')}s/step{skipped}",
                highlight=False,
                soft_wrap=True,
            )

    def on_health(self, event):
        what, todo = health_lines(event)
        if self.use_live:
            self.console.print(Text(what, style="bold yellow"), soft_wrap=True)
            self.console.print(Text(todo, style="yellow"), soft_wrap=True)
        else:
            self.console.print(what, highlight=False, soft_wrap=True, markup=False)
            self.console.print(todo, highlight=False, soft_wrap=True, markup=False)

    def on_time_limit(self, d):
        self.console.print(
            f"time limit of {d['minutes']:g} min: stopping after step {d['step']} of {d['total']}, "
            "then the evaluation",
            highlight=False,
        )

    def on_stopped(self, d):
        self.stop()  # the CLI prints the reason as its last line

    def on_end(self, d):
        self.stop()
        self.console.print(f"[bold]{d['result'].summary_line()}[/]")
        self.console.print(f"run folder: {d['result'].run_dir}")

    def stop(self):
        if self.live is not None:
            self.live.update(self._view())
            self.live.stop()
            self.live = None
        self.progress = None
