"""What a run holds before its first step, set up once for `train()` and for the API's `Trainer`.

`setup(config)` loads the task (a bad data file or reward is reported before a
slow model load), checks `--guide`, loads the policy (a quantized base
dequantised on a CPU; full fine-tuning refused on quantized weights), screens
the task's rows, bounds the reward calls in time, runs the `--prefilter`
pre-pass on the base model, adds the adapters, keeps the reference where one
is needed and makes the optimizer. A run folder as the model (`--model RUN`,
models/run_models.py) is its original base with the run's adapters loaded into
the trainable layers, shaped as the run's were, so training continues them; the
reference stays the original base. The command line and the Python API both
call it, so the two cannot set up different runs (a copy that left `kl_every`
out of when a reference is kept would log a KL of 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_map

from ..config import ConfigError, TrainConfig
from ..models.adapters import prepare_for_training
from ..models.loading import gguf_types_note, load_policy, resolve_model_path
from ..models.quantized import prepare_base
from ..models.run_models import RunModel, load_adapter_weights, read_run_model
from ..models.screen_info import context_length
from ..tasks.data import screen_task
from ..tasks.registry import Task
from .task_setup import load_task
from ..tasks.rewarding import with_timeout
from .guidance import check_guidance
from .prefilter import prefilter_train_rows
from .run_folder import prepare_run_folder


@dataclass
class RunState:
    """A run ready for its first step."""

    config: TrainConfig
    task: Task
    model: object
    tokenizer: object
    adapter_config: dict  # what save_adapters writes beside the weights
    ref_params: dict | None  # the reference's weights when they are not the base with adapters off
    optimizer: optim.Optimizer
    notes: list[str] = field(
        default_factory=list
    )  # lines for the run's log (GGUF types, float copy, prefilter)


def make_optimizer(config: TrainConfig) -> optim.Optimizer:
    """AdamW with linear warmup then cosine decay, over every optimizer update."""
    total = config.steps * config.objective.num_iterations
    warmup = min(config.warmup_steps, max(total - 1, 0))
    decay = optim.cosine_decay(config.lr, max(total - warmup, 1), end=config.lr * config.min_lr_ratio)
    schedule = (
        optim.join_schedules([optim.linear_schedule(config.lr / warmup, config.lr, warmup), decay], [warmup])
        if warmup > 0
        else decay
    )
    return optim.AdamW(learning_rate=schedule, weight_decay=config.weight_decay)


def keeps_reference(config: TrainConfig) -> bool:
    """Whether the reference is a copy of the starting weights rather than the base with adapters off:
    when it is refreshed, or with full fine-tuning (no adapters to switch off) when KL is in the loss or
    watched."""
    o = config.objective
    return o.ref_refresh_every > 0 or (config.fine_tune_type == "full" and (o.beta > 0 or o.kl_every > 0))


def guard_task(
    task: Task, config: TrainConfig, tokenizer, context: int | None, training: bool = True
) -> Task:
    """The task as a run uses it, in place: rows screened against its rewards and the model's context
    (bad rows and prompts too long for the model left out, on_bad_data), and every reward call bounded by
    reward_timeout. `train`, `eval` and `compare` all call it, so their accuracies are over the same rows
    and none of them waits forever on a reward. Calling it again (another model) screens the rows again.
    `context`: the model's length in positions (models/screen_info.py: of a loaded model, or read from its
    files without loading it), None where unknown. `training`: a task with no train rows is refused (eval
    and compare, which score held-out rows alone, pass False)."""
    screen_task(
        task,
        tokenizer,
        context,
        config.sampling.max_tokens,
        config.max_prompt_tokens,
        config.on_bad_data,
        training,
    )
    task.reward_functions = [with_timeout(fn, config.reward_timeout) for fn in task.reward_functions]
    if task.accuracy_reward is not None:
        task.accuracy_reward = with_timeout(task.accuracy_reward, config.reward_timeout)
    return task


def continued_config(config: TrainConfig, start: RunModel) -> TrainConfig:
    """The config with the starting run's adapter settings, so its adapters fit the layers made for them;
    a setting set here (not its default) that differs from the run's is refused."""
    saved, lora = start.adapter_config, start.adapter_config.get("lora_parameters") or {}
    theirs = {"fine_tune_type": saved.get("fine_tune_type", "lora")}
    if theirs["fine_tune_type"] != "full":
        theirs.update(
            lora_rank=lora.get("rank"), lora_scale=lora.get("scale"), lora_layers=saved.get("num_layers")
        )
    theirs = {k: v for k, v in theirs.items() if v is not None}
    for key, value in theirs.items():
        mine = getattr(config, key)
        if mine != value and mine != getattr(TrainConfig, key):
            raise ConfigError(
                f"--model {config.model}: its adapters have {key} {value}, not {mine}; leave "
                f"{key} out to continue them (or train from its base model)"
            )
    return replace(config, **theirs)


def starting_run(config: TrainConfig, writable: Path | None = None) -> tuple[TrainConfig, RunModel | None]:
    """The run or adapter folder `config.model` names (None for a plain model), and the config with its
    adapter settings; read before anything is written or loaded, so a broken or clashing folder costs
    nothing."""
    start = read_run_model(config.model)
    if start is None:
        return config, None
    if writable is not None and start.run_dir is not None and start.run_dir.resolve() == writable.resolve():
        raise ConfigError(
            f"--model {config.model} is this run's own folder: write the new run elsewhere "
            "(--output), or continue this one with --resume"
        )
    return continued_config(config, start), start


def load_base(config: TrainConfig, start: RunModel | None):
    """(model, tokenizer, weights note): the policy's base model (a starting run's original base),
    prepared."""
    model, tokenizer = load_policy(start.base if start is not None else config.model, keep_quantized=True)
    return model, tokenizer, prepare_base(model, config.keep_quantized, fine_tune_type=config.fine_tune_type)


def add_adapters(model, config: TrainConfig, start: RunModel | None) -> dict:
    """Fresh trainable layers (the caller loads a starting run's weights into them: load_adapter_weights);
    the adapter config to save, naming the original base model (what `mlx_lm.generate --adapter-path`
    and eval load them on)."""
    adapter_config = prepare_for_training(
        model,
        config.fine_tune_type,
        {
            "rank": config.lora_rank,
            "scale": config.lora_scale,
            "dropout": config.lora_dropout,
            "num_layers": config.lora_layers,
        },
    )
    adapter_config["model"] = resolve_model_path(start.base if start is not None else config.model)
    return adapter_config


def setup(config: TrainConfig, writable: Path | None = None) -> RunState:
    """The task, the policy with its adapters, the reference and the optimizer of a run.

    `writable`: a run folder to check, before the model loads (train() passes its own): that it can be
    written, and that a fresh run does not go into an earlier run's folder unless `overwrite`."""
    config, start = starting_run(config, writable)
    mx.random.seed(config.seed)
    task = load_task(config)
    if config.guide:
        check_guidance(task)
    if (
        writable is not None
    ):  # writable, and a fresh run never mixed into an earlier one's folder (run_folder.py)
        prepare_run_folder(writable, resume=bool(config.resume), overwrite=config.overwrite)
    model, tokenizer, weights_note = load_base(config, start)
    guard_task(task, config, tokenizer, context_length(model))
    # The pre-pass on the model the run starts from: only prompts it sometimes solves (prefilter.py)
    prefilter_note = (
        prefilter_train_rows(model, tokenizer, task, config) if config.prefilter and not start else None
    )
    adapter_config = add_adapters(model, config, start)
    # Copied before a starting run's weights go in: the reference is the original base, as with adapters off.
    ref_params = tree_map(lambda x: x, model.trainable_parameters()) if keeps_reference(config) else None
    if start is not None:
        load_adapter_weights(model, start)
        if config.prefilter:
            prefilter_note = prefilter_train_rows(model, tokenizer, task, config)
    notes = [
        n for n in (gguf_types_note(start.base if start else config.model), weights_note, prefilter_note) if n
    ]
    return RunState(config, task, model, tokenizer, adapter_config, ref_params, make_optimizer(config), notes)
