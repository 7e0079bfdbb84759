"""The live view of a supervised fine-tuning run: train's display (display.py) with sft's own numbers.

The progress bar with its ETA, health warnings and the log's line every `log_every` steps are
train's; the table and the lines show the loss, the validation loss, the gradient norm (a *
when clipped), the learning rate and tokens/s. StagedTrainDisplay is train's own view with a
warm start's stage drawn as this one.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .display import NOT_CHECKED, TrainDisplay, _fmt, trend

# The live table: (column title, metric key, format).
SFT_TABLE = (
    ("loss", "loss", ".4f"),
    ("val loss", "val_loss", ".4f"),
    ("grad", "grad_norm", ".3f"),
    ("lr", "lr", ".1e"),
    ("tok/s", "tokens_per_s", ".0f"),
)


def sft_table(history: list[dict]) -> Table:
    """The latest value of each metric and its trend; the validation loss as last measured."""
    table = Table(box=None, padding=(0, 1), show_edge=False, show_header=False)
    cells = []
    for title, key, spec in SFT_TABLE:
        values = [m.get(key) for m in history]
        value = next((v for v in reversed(values) if v is not None), None)
        cells.append((title, f"{_fmt(value, spec)} {trend(values)}".rstrip()))
    for _ in cells:
        table.add_column(justify="right")
    table.add_row(*[Text(t, style="dim") for t, _ in cells])
    table.add_row(*[v for _, v in cells])
    return table


def sft_step_line(m: dict, total: int) -> str:
    return (
        f"step {m['step']}/{total}  loss {_fmt(m.get('loss'), '.4f')}  grad {_fmt(m.get('grad_norm'), '.3f')}"
        f"{'*' if m.get('grad_clipped') else ''}  lr {_fmt(m.get('lr'), '.1e')}  "
        f"tok/s {_fmt(m.get('tokens_per_s'), '.0f')}  {_fmt(m.get('time/step_s'), '.2f')}s/step"
        + (f"  val_loss {m['val_loss']:.4f}" if m.get("val_loss") is not None else "")
    )


class SFTDisplay(TrainDisplay):
    """Receives sft()'s events (run/sft.py)."""

    def on_start(self, d):
        self.console.print(
            f"[bold]mlx-grpo sft[/] on [cyan]{d['sft']}[/]: {d['examples']} demonstrations, "
            f"{d['held_out']} held out",
            soft_wrap=True,
            highlight=False,
        )
        super().on_start(d)

    def _view(self):
        parts = [self.progress]
        if self.history:
            parts.append(sft_table(list(self.history)))
        return Group(*parts)

    def on_eval(self, d):
        if d["when"] == "after":
            self.stop()
        label = {"before": "before training", "after": "after training"}.get(
            d["when"], f"at step {d['when']}"
        )
        if d.get("val_loss") is not None:
            self.console.print(f"validation loss {label}: {d['val_loss']:.4f}", highlight=False)
        if d.get("not_checked"):
            self.console.print(NOT_CHECKED, highlight=False)
        if d.get("accuracy") is not None:
            self.console.print(
                f"accuracy {label}: {d['accuracy']:.3f} on {d['n']} held-out problems "
                f"({d.get('seconds', 0.0):.1f}s)",
                highlight=False,
            )

    def on_step(self, d):
        m = d["metrics"]
        self.history.append(m)
        if self.live is not None:
            self.progress.update(
                self.task_id,
                completed=m["step"],
                rate=f"{_fmt(m.get('time/step_s'), '.2f')}s/step",
                rollout="",
            )
            self.live.update(self._view())
        elif m["step"] % self.log_every == 0 or m["step"] == d["total"]:
            self.console.print(sft_step_line(m, d["total"]), highlight=False, soft_wrap=True)

    def on_end(self, d):
        self.stop()
        before, after = d.get("val_loss_before"), d.get("val_loss_after")
        if before is not None and after is not None:
            self.console.print(f"validation loss {before:.4f} -> {after:.4f}", highlight=False)
        super().on_end(d)


class StagedTrainDisplay(TrainDisplay):
    """train's display, drawing a warm start's events (sft's, before GRPO: run/warm_start.py) as sft's own."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.warm_start = None

    def on_warm_start(self, d):
        if self.warm_start is None:
            self.console.print("[bold]warm start[/]: supervised steps before GRPO", highlight=False)
            self.warm_start = SFTDisplay(self.console, self.log_every, self.use_live)
        self.warm_start(d["kind"], d["data"])
