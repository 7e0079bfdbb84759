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
from .losses import LOSS_DESCRIPTIONS
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
    helps["loss"] = "; ".join(f"{name}: {what} ({paper})" for name, (what, paper) in LOSS_DESCRIPTIONS.items())
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
    from .api import train as run_training  # the CLI is a thin layer over the Python API

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


# Options shared by `compare` and `eval` (see mlx_grpo/compare.py).
_TASK_HELP = "task to evaluate on; default: the run's task (arith without a run)"
_N_HELP = "number of prompts (the first N of the split); default: the run's eval_num_problems (200)"
_SAMPLES_HELP = "completions per prompt (K); K > 1 also reports pass@k"
_TEMPERATURE_HELP = "sampling temperature; default: 0 (greedy) for one sample, the run's temperature for more"


def _evaluation(task, data, reward_file, reward, max_tokens, n, split, samples, temperature, seed, run_dir, model):
    """(task, settings, n) from a run's config and the typed flags."""
    from .compare import build_settings, task_config
    from .tasks import load_task

    config = task_config(run_dir, model, {"task": task, "data": data, "reward_file": reward_file,
                                          "reward": reward or None, "max_tokens": max_tokens,
                                          "eval_num_problems": n})
    return load_task(config), build_settings(config, split, samples, temperature, seed), config.eval_num_problems


@app.command("compare")
def compare_command(
    trained: str = typer.Option(..., help="run folder, adapter folder, or model (folder or Hugging Face id)"),
    base: Optional[str] = typer.Option(None, help="model to compare against; default: the run's base model"),
    task: Optional[str] = typer.Option(None, help=_TASK_HELP),
    split: str = typer.Option("test", help="test or train"),
    n: Optional[int] = typer.Option(None, help=_N_HELP),
    samples: int = typer.Option(1, help=_SAMPLES_HELP),
    temperature: Optional[float] = typer.Option(None, help=_TEMPERATURE_HELP),
    max_tokens: Optional[int] = typer.Option(None, help="completion length limit; default: the run's"),
    seed: int = typer.Option(0, help="sampler seed, the same for both models"),
    output: Optional[Path] = typer.Option(None, help="report folder; default: RUN/compare for a run"),
    data: Optional[str] = typer.Option(None, help="prompts (as for train --data)"),
    reward_file: Optional[Path] = typer.Option(None, help="Python file defining reward functions"),
    reward: Optional[List[str]] = typer.Option(None, help="reward function name(s)"),
    plot: bool = typer.Option(True, help="write rewards.png (needs matplotlib: the plot extra of mlx-grpo)"),
):
    """Does the trained model beat the base? Both answer the same prompts; paired statistics decide."""
    from . import compare as cmp
    from . import compare_report as cmp_report

    console = Console()
    progress = None
    try:
        trained_spec = cmp.resolve_model(trained)
        base_spec = cmp.resolve_model(base) if base else cmp.default_base(trained_spec)
        task_obj, settings, count = _evaluation(task, data, str(reward_file) if reward_file else None, reward,
                                                max_tokens, n, split, samples, temperature, seed,
                                                trained_spec.run_dir or base_spec.run_dir, base_spec.model)
        progress = cmp_report.Progress(console)
        report = cmp.compare(base_spec, trained_spec, task_obj, settings, count, progress)
        progress.stop()
        written = cmp_report.write_report(report, output or cmp.default_output(trained_spec), chart=plot)
        cmp_report.print_report(report, console, written)
    except (cmp.CompareError, ConfigError, DataError, FileNotFoundError) as e:
        if progress is not None:
            progress.stop()
        fail(str(e))


@app.command("eval")
def eval_command(
    model: str = typer.Option(..., help="run folder, adapter folder, model folder or Hugging Face id"),
    adapter: Optional[str] = typer.Option(None, help="adapter folder to apply to --model"),
    task: Optional[str] = typer.Option(None, help=_TASK_HELP),
    split: str = typer.Option("test", help="test or train"),
    n: Optional[int] = typer.Option(None, help=_N_HELP),
    samples: int = typer.Option(1, help=_SAMPLES_HELP),
    temperature: Optional[float] = typer.Option(None, help=_TEMPERATURE_HELP),
    max_tokens: Optional[int] = typer.Option(None, help="completion length limit; default: the run's"),
    seed: int = typer.Option(0, help="sampler seed"),
    output: Optional[Path] = typer.Option(None, help="write report.json, report.md, rows.jsonl here"),
    data: Optional[str] = typer.Option(None, help="prompts (as for train --data)"),
    reward_file: Optional[Path] = typer.Option(None, help="Python file defining reward functions"),
    reward: Optional[List[str]] = typer.Option(None, help="reward function name(s)"),
):
    """Score one model on a task: accuracy, rewards, pass@k, lengths, speed."""
    from . import compare as cmp
    from . import compare_report as cmp_report

    console = Console()
    progress = None
    try:
        spec = cmp.resolve_model(model, adapter)
        task_obj, settings, count = _evaluation(task, data, str(reward_file) if reward_file else None, reward,
                                                max_tokens, n, split, samples, temperature, seed, spec.run_dir,
                                                spec.model)
        progress = cmp_report.Progress(console)
        report = cmp.evaluate(spec, task_obj, settings, count, progress)
        progress.stop()
        written = cmp_report.write_report(report, output, chart=False) if output else []
        cmp_report.print_report(report, console, written)
    except (cmp.CompareError, ConfigError, DataError, FileNotFoundError) as e:
        if progress is not None:
            progress.stop()
        fail(str(e))


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


# Typer's usage errors (unknown flag, bad value): the base class of its BadParameter,
# wherever this typer version keeps click.
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def main():
    """The CLI itself; the `mlx-grpo` command enters through mlx_grpo.__main__ (OpenBLAS first)."""
    try:
        # Not standalone: a bad flag (unknown, or a value of the wrong type) is
        # answered below in one line, like every other user error.
        code = app(standalone_mode=False)
    except _UsageError as e:
        hint = f" (see: mlx-grpo {e.ctx.info_name} --help)" if e.ctx is not None and e.ctx.parent is not None else ""
        err.print(f"[bold red]error:[/] {e.format_message()}{hint}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        err.print("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
