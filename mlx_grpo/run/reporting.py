"""Optional metric logging to Weights & Biases and TensorBoard (`--report-to`).

Neither package is a dependency: asking for one that is not installed is a
configuration error with the pip command to fix it. A reporter listens to the
trainer's events, like the terminal display does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..config_checks import REPORTERS, check_reporters  # noqa: F401 (checked with the other settings)


def scalars(metrics: dict) -> dict[str, float]:
    """The numeric entries of a metrics dict (bools as 0/1; text and None left out)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and k != "step"}


class WandbReporter:
    def __init__(self, config, run_dir: Path):
        import wandb

        self.wandb = wandb
        # the config as a plain dict of its flat settings, as config.yaml holds them
        self.run = wandb.init(
            project="mlx-grpo", name=Path(run_dir).name, dir=str(run_dir), config=config.flat()
        )

    def log(self, metrics: dict, step: int) -> None:
        self.wandb.log(scalars(metrics), step=step)

    def note(self, text: str, step: int) -> None:
        self.run.summary["health/last"] = text  # shows on the run's page

    def close(self) -> None:
        self.wandb.finish()


class TensorBoardReporter:
    def __init__(self, config, run_dir: Path):
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def log(self, metrics: dict, step: int) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, step)

    def note(self, text: str, step: int) -> None:
        self.writer.add_text("health", text, step)

    def close(self) -> None:
        self.writer.close()


_CLASSES = {"wandb": WandbReporter, "tensorboard": TensorBoardReporter}


def with_reporters(config, on_event: Callable[[str, dict], None]) -> Callable[[str, dict], None]:
    """on_event, also feeding the loggers named in config.report_to (unchanged when none)."""
    if not config.report_to:
        return on_event
    reporters = []

    def emit(kind: str, data: dict) -> None:
        if kind == "start":
            reporters.extend(_CLASSES[name](config, Path(data["run_dir"])) for name in config.report_to)
        elif kind == "step":
            for r in reporters:
                r.log(data["metrics"], data["metrics"]["step"])
        elif kind == "eval" and data.get("accuracy") is not None and data["when"] in ("before", "after"):
            # Evaluations during training arrive inside the step's metrics.
            step = 0 if data["when"] == "before" else config.steps
            for r in reporters:
                r.log({"eval/accuracy": data["accuracy"]}, step)
        elif kind == "health":
            for r in reporters:
                r.note(f"step {data['step']}: {data['title']}: {data['evidence']}", data["step"])
        on_event(kind, data)
        if kind in ("end", "stopped"):
            for r in reporters:
                r.close()
            reporters.clear()

    return emit
