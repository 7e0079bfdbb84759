"""What a supervised fine-tuning run holds before its first step: demonstrations, policy, adapters, optimizer.

The model, its adapters and the optimizer are set up as `train` sets them up (setup.py's
pieces: the same model sources, fine-tune types, quantized bases and schedule). The
demonstrations come from `--data` (mlx-lm's formats, tasks/sft_data.py) or from a built-in
task's own (`--task`, its train split only: sampling/demonstrations.py); the data is read
and checked before the slow model load, and every row is rendered with the loaded tokenizer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim

from ..config import ConfigError, TrainConfig, with_settings
from ..models.loading import gguf_types_note
from ..models.run_models import load_adapter_weights
from ..models.untrained_tokens import indistinct_tokens
from ..sampling.demonstrations import task_demonstrations
from ..sampling.kinds import rollouts_for
from ..tasks.data import DataError, read_split
from ..tasks.registry import BUILTIN_TASKS, Task, base_task
from ..tasks.sft_data import encode_rows, read_demonstrations
from ..tasks.splits import row_key, split_held_out
from .run_folder import prepare_run_folder
from .setup import add_adapters, load_base, make_optimizer, starting_run

# The validation loss reads at most this many of the validation split's demonstrations (its first).
# Each validation pass runs the model over all of them (before the first step, every eval_steps, at
# the end), and a web episode is about a thousand tokens: more rows would make the passes a large
# share of a real model's run on a CPU.
MAX_HELD_OUT = 32
# The validation loss reads at most this many tokens of held-out demonstrations (the first ones),
# for a validation split of the data's own too: at 0.5B on two CPU cores 32 web episodes (about
# 25k tokens) took 8 minutes a pass, and a run makes at least two.
MAX_VALIDATION_TOKENS = 8192

Example = tuple[list[int], list[float]]  # token ids, 1.0 on each token the model is taught to write


def within_validation_tokens(examples: list[Example], warnings: list[str]) -> list[Example]:
    """The first held-out examples that fit MAX_VALIDATION_TOKENS (at least one), noted when some are left
    out."""
    kept, total = [], 0
    for ids, flags in examples:
        if kept and total + len(ids) > MAX_VALIDATION_TOKENS:
            break
        kept.append((ids, flags))
        total += len(ids)
    if len(kept) < len(examples):
        warnings.append(
            f"the validation loss reads the first {len(kept)} of {len(examples)} held-out "
            f"demonstrations ({total} tokens, at most {MAX_VALIDATION_TOKENS})"
        )
    return kept


@dataclass
class SFTRun:
    config: TrainConfig
    model: object
    tokenizer: object
    adapter_config: dict
    optimizer: optim.Optimizer
    train: list[Example]
    valid: list[Example]
    task: Task | None  # a built-in task's run: its held-out accuracy before and after
    source: str  # where the demonstrations came from, for the display
    trained_rows: list[dict]  # the rows the demonstrations were made from: the run's record (tasks/splits.py)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def task_rows(task: Task, config: TrainConfig) -> tuple[list[dict], list[dict]]:
    """(train, held out): the task's rows a run trains on and those of its validation loss.

    The train split, never a held-out row: it is stored grouped (web's by kind, easiest first), so the
    rows are a seeded draw from all of it, not its head, cut to those the run's steps reach. The
    validation loss reads the validation split, the rows the run's accuracy checks read."""
    rows = random.Random(config.seed).sample(task.train_rows, len(task.train_rows))
    return rows[: config.steps * config.batch_size], task.eval_rows[:MAX_HELD_OUT]


def data_rows(
    config: TrainConfig, warnings: list[str]
) -> tuple[list[tuple[int, dict]], list[tuple[int, dict]]]:
    """(train, held out) numbered demonstrations of --data, split as `train` splits the same data
    (tasks/splits.py): a demonstration whose prompt is a held-out row of `train --data` is never learned."""
    train_rows, note = read_demonstrations(config.data, "train", config.on_bad_data)
    valid_rows, valid_note = read_demonstrations(config.data, "validation", config.on_bad_data)
    # The data's own test rows may be prompt rows or demonstrations: only their prompts matter here.
    test_rows, _, _ = read_split(
        config.data, "test", lambda row: None if isinstance(row, dict) else "not an object"
    )
    warnings += [n for n in (note, valid_note) if n]
    train_rows, valid_rows, _ = split_held_out(
        train_rows, valid_rows, test_rows, warnings, config.data, key=lambda numbered: row_key(numbered[1])
    )
    return train_rows, valid_rows[:MAX_HELD_OUT]


def _context(model) -> int | None:
    return getattr(getattr(model, "args", None), "max_position_embeddings", None)


def sft_setup(config: TrainConfig, writable: Path | None = None) -> SFTRun:
    """The demonstrations, the policy with its adapters and the optimizer of an sft run."""
    if config.warm_start.steps > 0:
        raise ConfigError(
            "warm_start_steps is train's (an sft stage before GRPO); sft itself takes --steps, --lr "
            "and --data"
        )
    if config.warm_start.web_kinds:
        raise ConfigError(
            "warm_start_web_kinds is train's (the kinds of its warm start); sft itself takes --web-kinds"
        )
    config, start = starting_run(
        config, writable
    )  # a run folder as --model: its base, its adapters continued
    mx.random.seed(config.seed)  # the adapters' initial weights: the same seed, the same run
    warnings: list[str] = []
    task = None
    if config.data and config.task not in BUILTIN_TASKS:
        try:
            train_rows, valid_rows = data_rows(config, warnings)
        except DataError as e:
            raise ConfigError(str(e)) from None
        if not train_rows:
            raise ConfigError(
                f"{config.data}: no demonstration left to train on after holding out the "
                "validation and test rows"
            )
        trained = [row for _, row in train_rows]
        source = config.data
    elif (
        config.task in BUILTIN_TASKS
    ):  # with --data: the task's rows from a local copy (gsm8k), as train reads them
        task = base_task(config)  # its rows and rewards: sft reads no judge and no tools file
        warnings += task.warnings
        train_rows, valid_rows = task_rows(task, config)
        trained = train_rows
        source = f"task {task.name} (train split)"
    else:
        raise ConfigError(
            "sft needs --data (a JSONL file, a folder or a dataset name) or --task with its own "
            f"demonstrations ({', '.join(BUILTIN_TASKS)})"
        )
    if writable is not None:
        prepare_run_folder(writable, resume=bool(config.resume), overwrite=config.overwrite)

    model, tokenizer, weights_note = load_base(config, start)
    try:
        if task is None:
            train, note = encode_rows(
                tokenizer,
                train_rows,
                config.data,
                config.on_bad_data,
                _context(model),
                config.system_prompt,
                config.prompt_format,
                config.stop,
            )
            valid, valid_note = encode_rows(
                tokenizer,
                valid_rows,
                f"{config.data} (validation)",
                config.on_bad_data,
                _context(model),
                config.system_prompt,
                config.prompt_format,
                config.stop,
            )
        else:
            spelled = _indistinct(model, tokenizer, warnings) if rollouts_for(task).plays_episodes else {}
            train, note = task_demonstrations(
                task, tokenizer, train_rows, config.max_episode_tokens, config.on_bad_data, source, spelled
            )
            valid, valid_note = task_demonstrations(
                task,
                tokenizer,
                valid_rows,
                config.max_episode_tokens,
                config.on_bad_data,
                f"{source}, held out",
                spelled,
            )
    except DataError as e:
        raise ConfigError(str(e)) from None
    warnings += [n for n in (note, valid_note) if n]
    valid = within_validation_tokens(valid, warnings)
    adapter_config = add_adapters(model, config, start)
    if start is not None:
        load_adapter_weights(model, start)
    optimizer = make_optimizer(with_settings(config, num_iterations=1))  # one optimizer step a step
    notes = [n for n in (gguf_types_note(start.base if start else config.model), weights_note) if n]
    return SFTRun(
        config,
        model,
        tokenizer,
        adapter_config,
        optimizer,
        train,
        valid,
        task,
        source,
        trained,
        warnings,
        notes,
    )


def _indistinct(model, tokenizer, warnings: list[str]) -> dict[int, str]:
    """The tokens a scripted episode spells out, said once in the run's warnings."""
    spelled = indistinct_tokens(model, tokenizer)
    if spelled:
        names = ", ".join(sorted(set(spelled.values())))
        warnings.append(
            f"the model's output head cannot tell {names} apart from other rarely seen tokens "
            "(one shared row): the scripted episodes write them in ordinary tokens, the same text"
        )
    return spelled
