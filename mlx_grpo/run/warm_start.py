"""The warm start inside `train`: supervised fine-tuning on demonstrations first, then GRPO from it.

With warm_start_steps > 0, `train` runs sft's loop (run/sft.py) into RUN/warm_start, a complete
sft run folder, then GRPO starts from that folder as from any run named as the model
(setup.py's starting_run: its adapters continued, the reference the original base). The sft
stage's held-out check before its first step is the base model's accuracy (the run's
accuracy_before; eval_before: false skips it, the stage's config carrying the run's setting); its
check after its last step is GRPO's starting accuracy, reused rather than measured twice, and made
either way; a stage on other web kinds (warm_start_web_kinds) or other data (warm_start_data) checked
other rows, so GRPO then makes its own check (under eval_before).

Resume: a warm start with a summary.json is finished and is not run again; one with a config.yaml
and no summary is continued (sft's exact resume); otherwise it starts.

Time: time_limit_minutes bounds the whole command. Its clock starts before the warm start, so
GRPO's stop rule (loop.past_time_limit) counts the warm start's time. The warm start's own
steps are not cut: a recipe gives it a small share of the limit. When it leaves no room for
GRPO's final evaluation, GRPO takes no step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable


from ..config import ConfigError, TrainConfig, dump_yaml, with_settings
from ..sampling import fixed_decode
from ..tasks.registry import BUILTIN_TASKS
from . import checkpoint as ckpt
from .run_folder import prepare_run_folder
from .run_result import RunResult
from .sft import sft

WARM_START_DIR = "warm_start"  # the stage's own run folder, inside the run's


@dataclass
class WarmStart:
    """A finished warm start, as GRPO reads it."""

    folder: Path  # RUN/warm_start: the model GRPO starts from
    accuracy_before: float | None  # the base model's held-out accuracy, before the warm start
    check: (
        dict | None
    )  # the held-out check after it (accuracy, n, seconds): GRPO's check before its first step
    ran_now: bool  # whether this command ran it (then its time counts against this command's limit)


def warm_start_config(config: TrainConfig, folder: Path, resume: bool) -> TrainConfig:
    """The sft stage's config: the warm_start group's values over the run's shared settings (model, task,
    the adapters' settings, seed, micro_batch_size, max_grad_norm, eval_num_problems, save_every ...). The
    command's time limit and loggers are GRPO's: the stage's steps are not cut, its events reach train's."""
    w = config.warm_start
    return with_settings(
        config,
        steps=w.steps,
        lr=w.lr,
        batch_size=w.batch_size,
        data=w.data or config.data,
        web_kinds=stage_web_kinds(config),
        output=str(folder),
        resume=str(folder) if resume else None,
        overwrite=config.overwrite and not resume,
        warm_start_steps=0,
        warm_start_web_kinds=[],
        time_limit_minutes=0.0,
        report_to=[],
    )


def stage_web_kinds(config: TrainConfig) -> list[str]:
    """The web kinds the warm start learns from (and checks on): warm_start_web_kinds, else the run's."""
    return list(config.warm_start.web_kinds or config.task_options.web_kinds)


def check_demonstrations(config: TrainConfig) -> None:
    """A warm start needs demonstrations: a built-in task's own, or warm_start_data."""
    if config.task not in BUILTIN_TASKS and not config.warm_start.data:
        raise ConfigError(
            f"warm_start_steps needs warm_start_data (demonstrations in mlx-lm's formats) for task "
            f"{config.task!r}: only the built-in tasks ({', '.join(BUILTIN_TASKS)}) have their own"
        )


def run_warm_start(config: TrainConfig, run_dir: Path, emit: Callable[[str, dict], None]) -> WarmStart | None:
    """Run (or resume, or find finished) the warm start of a run going into `run_dir`; None when it has none.
    Its events reach `emit` as ("warm_start", {"kind": sft's event, "data": its data})."""
    if config.warm_start.steps <= 0:
        return None
    check_demonstrations(config)
    run_dir = Path(run_dir)
    folder = run_dir / WARM_START_DIR
    if not config.resume:  # the run's folder is checked (and written, so --resume finds it) before the stage
        prepare_run_folder(run_dir, resume=False, overwrite=config.overwrite)
        ckpt.atomic_write_text(run_dir / "config.yaml", dump_yaml(replace(config, overwrite=False)))
    finished = bool(config.resume) and (folder / "summary.json").is_file()
    if not finished:
        resume = bool(config.resume) and (folder / "config.yaml").is_file()
        try:
            sft(
                warm_start_config(config, folder, resume),
                on_event=lambda kind, data: emit("warm_start", {"kind": kind, "data": data}),
            )
        except KeyboardInterrupt as e:  # the whole command is resumed, not the stage alone
            raise KeyboardInterrupt(
                str(e).replace(f"mlx-grpo sft --resume {folder}", f"mlx-grpo train --resume {run_dir}")
            ) from None
        release_stage_model()
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    check = None
    # A stage on other kinds or other data checked other rows: neither of its checks is the run's (GRPO makes
    # its own), so the run's summary never sets figures on different rows side by side.
    same_tasks = (
        stage_web_kinds(config) == list(config.task_options.web_kinds)
        and (config.warm_start.data or config.data) == config.data
    )
    if summary.get("accuracy_after") is not None and same_tasks:
        check = {
            "accuracy": summary["accuracy_after"],
            "n": summary["eval_n"],
            "seconds": summary.get("eval_seconds") or 0.0,
        }
    return WarmStart(
        folder, summary.get("accuracy_before") if same_tasks else None, check, ran_now=not finished
    )


def release_stage_model() -> None:
    """Free the stage's model before GRPO loads its own, so the command's peak memory is the larger stage's,
    not both together. sft's run drops its model and optimizer when it returns, but the compiled decode
    steps of its check after the last step still hold the model's weights until the next decode."""
    fixed_decode.release()


def grpo_config(config: TrainConfig, stage: WarmStart | None) -> TrainConfig:
    """The config GRPO is set up with: after a warm start, its folder is the model (its folder is ready)."""
    return config if stage is None else replace(config, model=str(stage.folder), overwrite=False)


def no_time_after(config: TrainConfig, stage: WarmStart | None, elapsed: float, eval_seconds: float) -> bool:
    """Whether a warm start this command ran left no room for GRPO's final evaluation in the time limit."""
    return (
        stage is not None
        and stage.ran_now
        and config.time_limit_minutes > 0
        and elapsed + eval_seconds > 60 * config.time_limit_minutes
    )


def with_warm_start(result: RunResult, stage: WarmStart | None) -> RunResult:
    """The run's result: accuracy_before the base's, accuracy_after_warm_start GRPO's starting accuracy."""
    if stage is None:
        return result
    return replace(
        result, accuracy_before=stage.accuracy_before, accuracy_after_warm_start=result.accuracy_before
    )
