"""A run folder or an adapter folder named as a model: its original base model with its adapters.

  - a run folder (config.yaml + adapter_config.json + adapters.safetensors, from
    `train` or `sft`): the base model its config.yaml names, with its adapters;
  - an adapter folder (adapter_config.json + adapters.safetensors, e.g.
    RUN/checkpoints/step_N or mlx-lm's own): its run's base model, or the
    "model" its adapter_config.json names, with those adapters.

A run started from another run names that run as its model, so the base is
followed down to a model that is not a run: a GRPO run from an SFT run has the
SFT run's base. Training (run/setup.py), eval and compare (evaluation/model_names.py)
and the task's choice of prompts (tasks/registry.py) all read a name here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import ConfigError

RUN_SETTINGS = "config.yaml"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapters.safetensors"
_MOST_NESTED = 32  # runs of runs deeper than this are a loop of folders naming each other


@dataclass(frozen=True)
class RunModel:
    base: str | None  # the original base model (never itself a run); None: the embedded model
    adapter: str  # the folder holding adapters.safetensors and adapter_config.json
    run_dir: Path | None  # the run the adapters belong to, if any
    adapter_config: dict  # fine_tune_type, num_layers, lora_parameters (and the base's path, "model")


def run_dir_of(adapter_dir: Path) -> Path | None:
    """The run a folder of adapters belongs to: itself, or RUN for RUN/checkpoints/step_N."""
    for candidate in (adapter_dir, adapter_dir.parent.parent):
        if (candidate / RUN_SETTINGS).is_file():
            return candidate
    return None


def is_run_folder(name: str | None) -> bool:
    """Whether a name is a folder of saved runs or adapters (then read_run_model reads it)."""
    if not isinstance(name, str) or not name:
        return False
    path = Path(name).expanduser()
    if not path.is_dir():
        return False
    return (path / ADAPTER_CONFIG).is_file() or (
        (path / RUN_SETTINGS).is_file() and not (path / "config.json").is_file()
    )


def read_run_model(name: str | None, _depth: int = 0) -> RunModel | None:
    """What a run or adapter folder stands for; None for any other name (a model folder, a file, an id)."""
    if not is_run_folder(name):
        return None
    path = Path(name).expanduser()
    if not (path / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"{name}: a run folder with no saved weights yet (no adapters.safetensors)")
    try:
        adapter_config = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path / ADAPTER_CONFIG}: unreadable ({e})") from None
    if not isinstance(adapter_config, dict):
        raise ConfigError(f"{path / ADAPTER_CONFIG}: unreadable (not a mapping)")
    run_dir = run_dir_of(path)
    if run_dir is not None:
        # The name the run was given (an alias, "embedded", a run folder), which its config.yaml keeps.
        base = _run_settings(run_dir).get("model", adapter_config.get("model"))
        base = base if base not in ("", None) else None  # None: the embedded model
    else:
        base = adapter_config.get("model")
        if not base:
            raise ConfigError(f"{path / ADAPTER_CONFIG} does not name its base model (key 'model')")
    if not (path / ADAPTER_WEIGHTS).is_file():
        raise ConfigError(f"{path}: no {ADAPTER_WEIGHTS}")
    if is_run_folder(base):  # a run of a run: its base is the earlier run's base
        if _depth >= _MOST_NESTED:
            raise ConfigError(f"{name}: runs that name each other as their model, in a loop")
        base = read_run_model(base, _depth + 1).base
    return RunModel(base, str(path), run_dir, adapter_config)


def base_model(name: str | None) -> str | None:
    """The model a name loads before any adapters: a run's original base, else the name itself."""
    start = read_run_model(name)
    return start.base if start is not None else name


def _run_settings(run_dir: Path) -> dict:
    path = run_dir / RUN_SETTINGS
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if values is not None and not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return values or {}


def load_adapter_weights(model, start: RunModel) -> None:
    """Put a run's saved adapters (or full weights) into the model's trainable layers, which must match them
    name for name and shape for shape: a loose load would leave a layer as it was made, silently."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    saved = mx.load(str(Path(start.adapter) / ADAPTER_WEIGHTS))
    trainable = dict(tree_flatten(model.trainable_parameters()))
    missing, extra = sorted(trainable.keys() - saved.keys()), sorted(saved.keys() - trainable.keys())
    reshaped = sorted(k for k in trainable.keys() & saved.keys() if trainable[k].shape != saved[k].shape)
    if missing or extra or reshaped:
        what = "; ".join(
            f"{label} {names[0]}{f' and {len(names) - 1} more' if len(names) > 1 else ''}"
            for label, names in (
                ("no saved", missing),
                ("not in the model:", extra),
                ("another shape:", reshaped),
            )
            if names
        )
        raise ConfigError(f"{start.adapter}: its adapters do not fit the model's layers ({what})")
    # Not strict: the frozen base weights are the model's own; the check above covered the trainable ones.
    model.load_weights([(k, v.astype(trainable[k].dtype)) for k, v in saved.items()], strict=False)
