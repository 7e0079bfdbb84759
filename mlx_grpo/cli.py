"""The `mlx-grpo` command line: a thin layer over the Python API.

Mistakes a user can make (a bad flag value, a missing file, a broken config)
end with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import inspect  # noqa: F401 (tests read the commands' signatures as cli.inspect.signature)
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from .cli_options import (
    MODEL_HELP,
    _SettingsCommand,
    _train_signature,
    _UsageError,
    _all_or_typed,
    _with_evaluation_options,
)
from .config import JUDGE_KEYS, ConfigError, build_config, file_settings_not_read
from .models.gguf_file import GGUFError
from .tasks.data import DataError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    help="GRPO-style reinforcement-learning fine-tuning of language models with MLX.",
)
err = Console(stderr=True)


def fail(message: str) -> None:
    # The message is plain text: brackets in it (pip install -e ".[plot]") are not rich markup.
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.callback()
def _root():
    """GRPO-style reinforcement-learning fine-tuning of language models with MLX."""


def _run_training(flags: dict, command: str) -> None:
    """What `train` and `sft` share: the config from flags, --config and --resume, the run with its live
    display, and one line for each error a user can cause."""
    config_file = str(flags.pop("config")) if flags.get("config") else None
    resume = flags.get("resume")
    if resume is not None:
        if not (Path(resume) / "config.yaml").is_file():
            fail(f"--resume {resume}: not a run folder (no config.yaml)")
        config_file = config_file or str(Path(resume) / "config.yaml")
        flags["output"] = resume

    from . import api  # the CLI is a thin layer over the Python API
    from .run.checkpoint import CheckpointError
    from .run.health import TrainingStopped
    from .run.sft_display import SFTDisplay, StagedTrainDisplay
    from .tasks.registry import recommended_settings
    from .tasks.rewarding import RewardError

    # train's view draws a warm start's stage too; sft's is its own
    run, view = (api.train, StagedTrainDisplay) if command == "train" else (api.sft, SFTDisplay)
    try:
        unread = file_settings_not_read(config_file, command)
        if unread:  # a train recipe serves sft too (docs/real-models.md): say what this command leaves out
            err.print(
                f"{command} does not read {', '.join(unread)} (set in {config_file}): left out",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        cfg = build_config(flags, config_file, task_defaults=recommended_settings, command=command)
        display = view(log_every=cfg.log_every)
        try:
            run(cfg, on_event=display)
        finally:
            display.stop()
    except (ConfigError, DataError, FileNotFoundError, GGUFError, CheckpointError, RewardError) as e:
        fail(str(e))
    except KeyboardInterrupt as e:  # Ctrl-C (see interrupt.py): the message says where the checkpoint is
        err.print(
            str(e) or "interrupted at once; the newest complete checkpoint is intact",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(130)
    except TrainingStopped as e:  # the run stopped itself (NaN/Inf steps): one line, not a traceback
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def train(**flags):
    """Train a model with GRPO. With no arguments: the embedded tiny model on the arith task."""
    _run_training(flags, "train")


train.__signature__ = _train_signature("train")
app.command()(train)


def sft(**flags):
    """Supervised fine-tuning on demonstrations: --data (mlx-lm's JSONL formats) or a task's own (--task)."""
    _run_training(flags, "sft")


sft.__signature__ = _train_signature("sft")
app.command()(sft)


def _evaluation(options: dict, run_dir, model):
    """(task, settings, n) from a run's config and the typed shared options."""
    from .evaluation.compare import build_settings, task_config
    from .run.task_setup import load_task

    config = task_config(
        run_dir,
        model,
        {
            "task": options["task"],
            "data": options["data"],
            "reward_file": str(options["reward_file"]) if options["reward_file"] else None,
            "reward": options["reward"] or None,
            "max_tokens": options["max_tokens"],
            **{k: _all_or_typed(options[k]) for k in ("web_kinds", "multihop_hops", "multihop_chains")},
            "decode_concurrency": options["decode_concurrency"],
            **{k: options[k] for k in JUDGE_KEYS},
            "eval_num_problems": options["n"],
            "system_prompt": options["system_prompt"],
        },
        options["config"],
    )
    settings = build_settings(
        config,
        options["split"],
        options["samples"],
        options["temperature"],
        options["seed"],
        options["cache"],
    )
    return load_task(config), settings, config.eval_num_problems


def _say_gguf_types(console, specs) -> None:
    """How each GGUF model's tensor types were carried, one line a model, before anything is generated."""
    from .models.loading import ModelNotInstalled, StoreError, gguf_types_note

    notes = []
    for spec in specs:
        try:
            note = gguf_types_note(spec.model)
        except (GGUFError, ModelNotInstalled, StoreError, FileNotFoundError):
            continue  # loading the model says what is wrong with it, in one line
        if note and note not in notes:
            notes.append(note)
            console.print(note, highlight=False, markup=False, soft_wrap=True)


@app.command("compare")
@_with_evaluation_options
def compare_command(
    trained: str = typer.Option(..., help=f"run folder, adapter folder, or {MODEL_HELP}"),
    base: Optional[str] = typer.Option(
        None,
        help="model to compare against (as --trained); default: the run's original "
        "base model (for a run started from a run, that run's base)",
    ),
    output: Optional[Path] = typer.Option(None, help="report folder; default: RUN/compare for a run"),
    plot: bool = typer.Option(True, help="write rewards.png (needs matplotlib: the plot extra of mlx-grpo)"),
    **options,
):
    """Does the trained model beat the base? Both answer the same prompts; paired statistics decide."""
    from .evaluation import compare as cmp
    from .evaluation import compare_report as cmp_report
    from .tasks.rewarding import RewardError

    console = Console()
    progress = None
    try:
        trained_spec = cmp.resolve_model(trained)
        base_spec = cmp.resolve_model(base) if base else cmp.default_base(trained_spec)
        task_obj, settings, count = _evaluation(
            options, trained_spec.run_dir or base_spec.run_dir, base_spec.model
        )
        _say_gguf_types(console, [base_spec, trained_spec])
        progress = cmp_report.Progress(console)
        report = cmp.compare(base_spec, trained_spec, task_obj, settings, count, progress)
        progress.stop()
        written = cmp_report.write_report(report, output or cmp.default_output(trained_spec), chart=plot)
        cmp_report.print_report(report, console, written)
    except (cmp.CompareError, ConfigError, DataError, FileNotFoundError, GGUFError, RewardError) as e:
        if progress is not None:
            progress.stop()
        fail(str(e))


@app.command("eval")
@_with_evaluation_options
def eval_command(
    model: str = typer.Option(..., help=f"run folder, adapter folder, or {MODEL_HELP}"),
    adapter: Optional[str] = typer.Option(None, help="adapter folder to apply to --model"),
    output: Optional[Path] = typer.Option(None, help="write report.json, report.md, rows.jsonl here"),
    **options,
):
    """Score one model on a task: accuracy, rewards, pass@k, lengths, speed."""
    from .evaluation import compare as cmp
    from .evaluation import compare_report as cmp_report
    from .tasks.rewarding import RewardError

    console = Console()
    progress = None
    try:
        spec = cmp.resolve_model(model, adapter)
        task_obj, settings, count = _evaluation(options, spec.run_dir, spec.model)
        _say_gguf_types(console, [spec])
        progress = cmp_report.Progress(console)
        report = cmp.evaluate(spec, task_obj, settings, count, progress)
        progress.stop()
        written = cmp_report.write_report(report, output, chart=False) if output else []
        cmp_report.print_report(report, console, written)
    except (cmp.CompareError, ConfigError, DataError, FileNotFoundError, GGUFError, RewardError) as e:
        if progress is not None:
            progress.stop()
        fail(str(e))


@app.command()
def plot(
    run_dirs: List[Path] = typer.Argument(
        ..., metavar="RUN_DIR...", help="run folders; several are overlaid"
    ),
    output: Optional[Path] = typer.Option(
        None, help="PNG to write; default RUN_DIR/plot.png for one run, plot.png here for several"
    ),
):
    """Plot a run's curves (reward, eval accuracy, KL, grad norm, entropy, length, lr) into a PNG."""
    from .evaluation.plot import PlotError, plot_runs

    target = output or (run_dirs[0] / "plot.png" if len(run_dirs) == 1 else Path("plot.png"))
    try:
        plot_runs(run_dirs, target)
    except PlotError as e:
        fail(str(e))
    Console().print(f"wrote {target}", highlight=False, soft_wrap=True)


@app.command(name="inspect")
def inspect_command(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="a run folder"),
    step: Optional[int] = typer.Option(None, help="show this step's completion or episode only"),
    index: Optional[int] = typer.Option(
        None, help="which of the step's completions (from 0; default 0), in completions.jsonl's order"
    ),
    first_tokens: Optional[int] = typer.Option(
        None,
        help="instead: the likeliest first tokens of "
        "the answer to this many held-out prompts, base and "
        "trained (loads both models)",
    ),
):
    """Summarise a run from its files: settings, first/last/best metrics, health events, checkpoints; and
    for a multi-turn run one episode turn by turn, masked spans marked (--step N --index K picks the one)."""
    from .evaluation.compare import CompareError
    from .evaluation.first_tokens import first_token_lines
    from .evaluation.first_tokens import first_tokens as first_tokens_of
    from .evaluation.inspect_episode import OPEN, last_episode_lines, record_lines
    from .evaluation.inspect_run import summarize
    from .evaluation.plot import PlotError

    try:
        if first_tokens is not None:
            lines = first_token_lines(first_tokens_of(run_dir, first_tokens))
        elif step is not None or index is not None:
            lines = record_lines(run_dir, step, index or 0)
        else:
            episode = last_episode_lines(run_dir)  # a multi-turn run's last step's first episode
            lines = summarize(run_dir) + ([""] + episode if episode else [])
    except (PlotError, CompareError, ConfigError, DataError, GGUFError) as e:
        fail(str(e))
    out = Console()
    for line in lines:  # masked spans dimmed as well as bracketed
        out.print(
            line,
            highlight=False,
            markup=False,
            soft_wrap=True,
            style="dim" if line.lstrip().startswith(OPEN) else None,
        )


@app.command("export")
def export_command(
    source: str = typer.Argument(
        ...,
        metavar="SOURCE",
        help="run folder or adapter folder; its base model is "
        "the one named in its config.yaml or adapter_config.json",
    ),
    gguf: Optional[Path] = typer.Option(None, help="write a GGUF file here (llama.cpp, Ollama, LM Studio)"),
    mlx: Optional[Path] = typer.Option(None, help="write an MLX model folder here (mlx-lm)"),
    outtype: str = typer.Option(
        "f16",
        help="GGUF tensor type: f16, q8_0 or q4_0 (norms stay float32); q4_k_m, "
        "q5_k_m or q6_k through llama.cpp's quantizer (llama-cpp-python)",
    ),
    force: bool = typer.Option(False, help="overwrite an existing output"),
):
    """Fuse a run's adapters into its base model and write the result as GGUF and/or an MLX folder."""
    from .evaluation import compare as cmp
    from .models.export import ExportError, export

    try:
        spec = cmp.resolve_model(source)
        if spec.adapter is None:
            fail(f"{source}: no adapters to export (not a run folder or an adapter folder)")
        written = export(spec.model, spec.adapter, gguf, mlx, outtype, force)
    except (cmp.CompareError, ExportError, GGUFError, FileNotFoundError) as e:
        fail(str(e))
    for path in written:
        size = (
            sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            if path.is_dir()
            else path.stat().st_size
        )
        Console().print(f"wrote {path} ({size / 1e6:.1f} MB)", highlight=False, soft_wrap=True)


for _info in app.registered_commands:  # every command refuses a setting it does not read in one line
    _info.cls = _SettingsCommand


def main():
    """The CLI itself; the `mlx-grpo` command enters through mlx_grpo.__main__ (OpenBLAS first)."""
    try:
        # Not standalone: a bad flag (unknown, or a value of the wrong type) is
        # answered below in one line, like every other user error.
        code = app(standalone_mode=False)
    except _UsageError as e:
        hint = (
            f" (see: mlx-grpo {e.ctx.info_name} --help)"
            if e.ctx is not None and e.ctx.parent is not None
            else ""
        )
        err.print(f"[bold red]error:[/] {e.format_message()}{hint}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        err.print("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
