"""The live terminal view of a training run (rich).

On a terminal: a progress bar with ETA and the key numbers of the last step.
Elsewhere (CI, a log file): one plain line every `log_every` steps.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def step_summary(m: dict) -> str:
    return (f"reward {_fmt(m.get('reward/mean'), '.3f')} ± {_fmt(m.get('reward/std'), '.3f')}  "
            f"best {_fmt(m.get('reward/best_of_n'), '.2f')}  kl {_fmt(m.get('kl'), '.4f')}  "
            f"grad {_fmt(m.get('grad_norm'), '.3f')}{'*' if m.get('grad_clipped') else ''}  "
            f"len {_fmt(m.get('completion/mean_length'), '.1f')}  tok/s {_fmt(m.get('tokens_per_s'), '.0f')}")


class TrainDisplay:
    """Receives the trainer's events (see trainer.train's on_event)."""

    def __init__(self, console: Console | None = None, log_every: int = 1):
        self.console = console or Console()
        self.log_every = log_every
        self.progress = None
        self.task_id = None
        self.last_kl = None  # KL is not measured every step when beta = 0

    def __call__(self, kind: str, data: dict) -> None:
        getattr(self, f"on_{kind}", lambda d: None)(data)

    def on_start(self, d):
        c = d["config"]
        self.console.print(f"[bold]mlx-grpo[/] task [cyan]{c.task}[/] model [cyan]{c.model or 'embedded tiny-arith'}[/] "
                           f"-> {d['run_dir']}", soft_wrap=True)
        for w in d["warnings"]:
            self.console.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
        if d["resumed_from"]:
            self.console.print(f"resuming after step {d['resumed_from']}")
        if self.console.is_terminal:
            self.progress = Progress(
                TextColumn("step"), MofNCompleteColumn(), BarColumn(bar_width=24), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[summary]}"),
                console=self.console, transient=False,
            )
            self.task_id = self.progress.add_task("train", total=c.steps, completed=d["resumed_from"], summary="")
            self.progress.start()

    def on_eval(self, d):
        if d["when"] == "after":
            self.stop()  # the finished bar stays above the final numbers
        if d.get("accuracy") is None:
            return
        label = {"before": "before training", "after": "after training"}.get(d["when"], f"at step {d['when']}")
        self.console.print(f"accuracy {label}: {d['accuracy']:.3f} on {d['n']} held-out problems "
                           f"({d['seconds']:.1f}s)")

    def on_step(self, d):
        m = d["metrics"]
        if m.get("kl") is not None:
            self.last_kl = m["kl"]
        m = {**m, "kl": self.last_kl}
        if self.progress is not None:
            self.progress.update(self.task_id, completed=m["step"], summary=step_summary(m))
        elif m["step"] % self.log_every == 0 or m["step"] == d["total"]:
            self.console.print(f"step {m['step']}/{d['total']}  {step_summary(m)}  "
                               f"{m['time/step_s']:.2f}s/step", highlight=False, soft_wrap=True)

    def on_end(self, d):
        self.stop()
        self.console.print(f"[bold]{d['result'].summary_line()}[/]")
        self.console.print(f"run folder: {d['result'].run_dir}")

    def stop(self):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
