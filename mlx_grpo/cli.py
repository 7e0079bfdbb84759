"""The `mlx-grpo` command line: a thin layer over the Python API.

Mistakes a user can make (a bad flag value, a missing file, a broken config)
end with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import inspect
import sys
import typing
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from .config import _HINTS, FIELDS, ConfigError, build_config, field_help
from .data import DataError

app = typer.Typer(add_completion=False, no_args_is_help=False,
                  help="GRPO-style reinforcement-learning fine-tuning of language models with MLX.")
err = Console(stderr=True)


def fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.callback()
def _root():
    """GRPO-style reinforcement-learning fine-tuning of language models with MLX."""


def _option_type(name: str):
    """The CLI type of a setting: lists are repeatable flags, everything else optional."""
    hint = _HINTS[name]
    if name == "reward":
        return Optional[List[str]]
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    if typing.get_origin(base) is list:
        return Optional[str]  # comma-separated, e.g. --reward-weights 1,0.2
    return Optional[base]


def _train_signature() -> inspect.Signature:
    """One flag per TrainConfig field, help text from the field's comment.

    Every flag defaults to None, meaning "not typed": only typed flags override
    the config file and the task's settings.
    """
    helps = field_help()
    params = [
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                          default=typer.Option(None, help="YAML file of settings; typed flags override it.")),
    ]
    for name in FIELDS:
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=_option_type(name),
                                        default=typer.Option(None, help=helps.get(name, ""))))
    return inspect.Signature(params)


def train(**flags):
    """Train a model with GRPO. With no arguments: the embedded tiny model on the arith task."""
    config_file = str(flags.pop("config")) if flags.get("config") else None
    resume = flags.get("resume")
    if resume is not None:
        if not (Path(resume) / "config.yaml").is_file():
            fail(f"--resume {resume}: not a run folder (no config.yaml)")
        config_file = config_file or str(Path(resume) / "config.yaml")
        flags["output"] = resume

    from .checkpoint import CheckpointError
    from .display import TrainDisplay
    from .rewarding import RewardError
    from .health import TrainingStopped
    from .tasks import recommended_settings
    from .trainer import train as run_training

    try:
        cfg = build_config(flags, config_file, task_defaults=recommended_settings)
        display = TrainDisplay(log_every=cfg.log_every)
        try:
            run_training(cfg, on_event=display)
        finally:
            display.stop()
    except (ConfigError, DataError, FileNotFoundError, CheckpointError, RewardError) as e:
        fail(str(e))
    except KeyboardInterrupt as e:  # Ctrl-C (see interrupt.py): the message says where the checkpoint is
        err.print(str(e) or "interrupted at once; the newest complete checkpoint is intact", highlight=False,
                  soft_wrap=True)
        raise typer.Exit(130)
    except TrainingStopped as e:  # the run stopped itself (NaN/Inf steps): one line, not a traceback
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


train.__signature__ = _train_signature()
app.command()(train)


@app.command()
def plot(run_dirs: List[Path] = typer.Argument(..., metavar="RUN_DIR...", help="run folders; several are overlaid"),
         output: Optional[Path] = typer.Option(None, help="PNG to write; default RUN_DIR/plot.png for one run, "
                                                            "plot.png here for several")):
    """Plot a run's curves (reward, eval accuracy, KL, grad norm, entropy, length, lr) into a PNG."""
    from rich.markup import escape

    from .plot import PlotError, plot_runs

    target = output or (run_dirs[0] / "plot.png" if len(run_dirs) == 1 else Path("plot.png"))
    try:
        plot_runs(run_dirs, target)
    except PlotError as e:
        fail(escape(str(e)))  # "mlx-grpo[plot]" is not rich markup
    Console().print(f"wrote {target}", highlight=False, soft_wrap=True)


@app.command(name="inspect")
def inspect_command(run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run folder")):
    """Summarise a run from its files: settings, first/last/best metrics, health events, checkpoints."""
    from .inspect_run import summarize
    from .plot import PlotError

    try:
        lines = summarize(run_dir)
    except PlotError as e:
        fail(str(e))
    out = Console()
    for line in lines:
        out.print(line, highlight=False, markup=False, soft_wrap=True)


def main():
    from .blas import use_openblas

    use_openblas()  # Linux CPU: re-executes once with OpenBLAS preloaded when installed (MLX_GRPO_OPENBLAS=0: off)
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
