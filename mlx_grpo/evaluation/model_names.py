"""What a model name means to `compare` and `eval`: a run folder, an adapter folder, or a model.

- a run folder (config.yaml + adapters.safetensors): its base model plus its
  adapters (or its full weights, for fine_tune_type full); the run's task,
  data, rewards and max_tokens become the defaults. A run started from another
  run (`train --model SFT_RUN`) has that run's base: the original model
  (models/run_models.py reads the names, for training too);
- an adapter folder (adapter_config.json, e.g. RUN/checkpoints/step_N): its
  base model ("model" in adapter_config.json) plus those adapters;
- a model folder, .gguf file, Hugging Face id, packaged model (smollm2-135m) or
  store name (ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO); "embedded": the tiny model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import JUDGE_KEYS, READS, ConfigError, TrainConfig, build_config, load_yaml
from ..models.loading import EMBEDDED_MODEL, PACKAGED_MODELS
from ..models.run_models import is_run_folder, read_run_model, run_dir_of
from ..setting_groups import TASK_OPTIONS, task_options_of
from ..tasks.registry import recommended_settings

# Settings a run folder passes on to a comparison: what its task and prompts were.
_TASK_KEYS = (
    "task",
    "data",
    "reward_file",
    "reward",
    "reward_weights",
    "system_prompt",
    "prompt_format",
    "stop",
    *TASK_OPTIONS,
    "tools",
    "tool_timeout",
    "tool_style",
    *JUDGE_KEYS,
)
# Settings that guard the task as the run guarded it (run/setup.py's guard_task): the same rows, the same time
# limit.
_GUARD_KEYS = ("reward_timeout", "on_bad_data", "max_prompt_tokens")


class CompareError(ValueError):
    """A mistake in what to compare (a missing folder, a model that does not load); one line."""


# ---------------------------------------------------------------------------
# What a model name means


@dataclass
class ModelSpec:
    model: str | None  # mlx-lm model folder or HF id; None: the embedded model
    adapter: str | None = None  # adapter folder applied on top (LoRA/DoRA or full weights)
    run_dir: Path | None = None  # the training run this came from, if any

    @property
    def label(self) -> str:
        base = self.model or "embedded tiny-arith"
        return f"{base} + {self.adapter}" if self.adapter else base


def _adapter_run(adapter: str | None) -> Path | None:
    """The run an --adapter folder came from (its task becomes the default), if any."""
    path = Path(adapter).expanduser() if adapter else None
    return run_dir_of(path) if path is not None and path.is_dir() else None


def resolve_model(name: str, adapter: str | None = None) -> ModelSpec:
    """Read a --trained/--base/--model value (see the module docstring)."""
    if name in ("", EMBEDDED_MODEL):
        return ModelSpec(None, adapter, _adapter_run(adapter))
    if name in PACKAGED_MODELS or name.startswith(("ollama:", "lmstudio:")):  # resolved where it loads
        return ModelSpec(name, adapter, _adapter_run(adapter))
    if is_run_folder(name):
        if adapter is not None and (Path(name).expanduser() / "adapter_config.json").is_file():
            raise CompareError(f"{name} is an adapter folder already; --adapter goes with a plain model")
        try:  # the original base (a run of a run: the first run's base) with this folder's adapters
            start = read_run_model(name)
        except ConfigError as e:
            raise CompareError(str(e)) from None
        return ModelSpec(start.base, start.adapter, start.run_dir)
    path = Path(name).expanduser()
    if not path.exists() and ("/" not in name or name.startswith((".", "/", "~"))):
        raise CompareError(
            f"{name}: not found (not a run folder, an adapter folder, a model folder, a .gguf "
            f"file, a Hugging Face id or a packaged model: {', '.join(PACKAGED_MODELS)})"
        )
    return ModelSpec(name, adapter, _adapter_run(adapter))


def _run_settings(run_dir: Path) -> dict:
    try:
        return load_yaml(run_dir / "config.yaml")
    except ConfigError as e:
        raise CompareError(str(e)) from None


def task_config(
    run_dir: Path | None, model: str | None, overrides: dict, config_file: str | Path | None = None
) -> TrainConfig:
    """The TrainConfig a comparison reads its task from.

    The run's settings (task, data, rewards, max_tokens, ...) come first, then
    those of a training config file (--config: its task, sampling and guard keys
    only, so a base model is scored as that config would train it), then the typed
    flags. A different --task drops the run's data and rewards, which belonged
    to the run's task.
    """
    values: dict = {}
    if run_dir is not None:
        values = _task_settings(_run_settings(run_dir))
    if config_file is not None:
        try:
            settings = load_yaml(config_file)
        except ConfigError as e:
            raise CompareError(str(e)) from None
        values = _layered(values, _task_settings(settings))
    values = _layered(values, {k: v for k, v in overrides.items() if v is not None})
    values["model"] = model
    return build_config(values, task_defaults=recommended_settings)


def _task_settings(settings: dict) -> dict:
    """The settings eval and compare read (setting_groups.COMMAND_READS): the task, its sampling and
    guards."""
    return {k: v for k, v in settings.items() if k in READS["eval"]}


def task_settings(config: TrainConfig) -> dict:
    """The settings of `config` that make and guard its task, by flat name (how it is sampled is compare's
    Settings' to say). Other tasks' options are left out: a new web option changes no multihop answer."""
    flat = config.flat()
    others = set(TASK_OPTIONS) - set(task_options_of(config.task))
    return {k: flat[k] for k in (*_TASK_KEYS, *_GUARD_KEYS) if k not in others}


def _layered(values: dict, over: dict) -> dict:
    """`values` with `over` on top; a different task in `over` first drops the task settings below it."""
    if over.get("task") not in (None, values.get("task")):
        values = {k: v for k, v in values.items() if k not in _TASK_KEYS}
    return {**values, **over}


def default_base(trained: ModelSpec) -> ModelSpec:
    """The model the trained one started from: its adapters' original base (for a run started from another
    run, that run's base: read_run_model follows the runs down)."""
    if trained.adapter is None:
        raise CompareError(
            f"{trained.label} is a whole model with no record of its base; "
            "name the model to compare against with --base"
        )
    return ModelSpec(trained.model, None)
