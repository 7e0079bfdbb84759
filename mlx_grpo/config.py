"""Training configuration: one dataclass, filled in layers.

Precedence, lowest first: the defaults below, the task's recommended settings
(the embedded arith task tunes lr, max_tokens, ... for its tiny model), the
YAML file given with --config, then the flags typed on the command line. A
flag that is not typed never overrides anything.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .advantages import SCALE_MODES
from .losses import LOSS_TYPES
from .policy import FINE_TUNE_TYPES


class ConfigError(ValueError):
    """A configuration mistake the user can fix; the message says how."""


@dataclass
class TrainConfig:
    # What to train, on what
    model: str | None = None  # local folder or Hugging Face id; None: the embedded tiny model
    task: str = "arith"  # a built-in task, or "custom" with --data and --reward-file
    data: str | None = None  # JSONL file, folder with train.jsonl/test.jsonl, or a HF dataset name
    reward_file: str | None = None  # Python file defining reward functions
    reward: list[str] = field(default_factory=list)  # reward function names (from reward_file or the task)
    reward_weights: list[float] | None = None  # one per reward; default 1.0 each
    system_prompt: str | None = None  # overrides the task's system prompt

    # Rollouts
    steps: int = 100  # GRPO steps (one rollout batch each)
    batch_size: int = 8  # prompts per step
    group_size: int = 8  # completions per prompt
    max_tokens: int = 256  # completion length limit
    temperature: float = 1.0  # sampling temperature; log-probs are taken at the same temperature
    top_p: float = 1.0  # nucleus sampling (1: off)
    top_k: int = 0  # top-k sampling (0: off)
    min_p: float = 0.0  # min-p sampling (0: off)
    decode_concurrency: int = 256  # sequences decoded at once; independent of micro_batch_size

    # Objective
    loss: str = "grpo"  # grpo | bnpo | dr_grpo | dapo: how token terms are normalised
    num_iterations: int = 1  # updates per rollout batch (>1 reuses rollouts; the ratio matters)
    epsilon_low: float = 0.2  # ratio clipped below at 1 - epsilon_low
    epsilon_high: float = 0.2  # ratio clipped above at 1 + epsilon_high (clip-higher: > epsilon_low)
    beta: float = 0.0  # KL(k3) weight to the reference model
    kl_every: int = 10  # with beta = 0, measure KL to the reference every N steps (0: never)
    scale_rewards: str = "none"  # none | group | batch
    scale_eps: float = 1e-4  # added to the std when scaling advantages

    # Optimisation
    fine_tune_type: str = "lora"  # lora | dora | full
    lora_rank: int = 8  # LoRA rank
    lora_scale: float = 20.0  # LoRA output scale (mlx-lm's convention, not alpha)
    lora_dropout: float = 0.0  # dropout on the LoRA input
    lora_layers: int = -1  # how many of the last blocks get adapters; -1: all
    lr: float = 1e-5  # peak learning rate (AdamW)
    warmup_steps: int = 10  # linear warmup, in optimizer updates
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    weight_decay: float = 0.0  # AdamW weight decay
    max_grad_norm: float = 1.0  # global gradient-norm clip; the norm before clipping is logged
    micro_batch_size: int = 16  # sequences per forward/backward; gradients are accumulated
    logprob_chunk_size: int | None = None  # positions per vocabulary-projection chunk; None: automatic

    # Bookkeeping
    seed: int = 0  # the same seed gives the same run
    output: str | None = None  # run folder; default checkpoints/<task>-<time>
    resume: str | None = None  # run folder to continue
    save_every: int = 50  # checkpoint every N steps, and at the end
    keep_checkpoints: int = 2  # how many step checkpoints to keep
    eval_steps: int = 0  # evaluate every N steps; 0: only before and after training
    eval_num_problems: int = 200  # held-out problems for accuracy (greedy decoding)
    log_every: int = 1  # print a line every N steps when not on a terminal


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


def field_help() -> dict[str, str]:
    """Each setting's comment in TrainConfig above: the one description, used by --help."""
    source = inspect.getsource(TrainConfig)
    return dict(re.findall(r"^\s+(\w+): [^=\n]+=[^#\n]+#\s*(.+)$", source, flags=re.M))


def _coerce(name: str, value):
    """Check/convert one value to the field's type, with a clear message."""
    hint = _HINTS[name]
    union_args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union else ()
    if value is None:
        if type(None) in union_args:
            return None
        raise ConfigError(f"{name}: a value is required")
    base = next((a for a in union_args if a is not type(None)), hint)
    origin = typing.get_origin(base)
    try:
        if origin is list:
            (item,) = typing.get_args(base)
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, (list, tuple)):
                value = [value]
            return [_scalar(item, v) for v in value]
        return _scalar(base, value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected {_type_name(base)}, got {value!r}") from None


def _scalar(kind, value):
    if kind is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "1", "yes", "on"):
            return True
        if str(value).lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError(value)
    if kind is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        return int(value)
    if kind is float:
        if isinstance(value, bool):
            raise ValueError(value)
        return float(value)
    if kind is str:
        if isinstance(value, (dict, list)):
            raise TypeError(value)
        return str(value)
    return value


def _type_name(kind) -> str:
    origin = typing.get_origin(kind)
    if origin is list:
        return f"a list of {typing.get_args(kind)[0].__name__}"
    return {int: "an integer", float: "a number", str: "text", bool: "true or false"}.get(kind, str(kind))


def _normalise_key(key: str) -> str:
    return key.replace("-", "_")


def check_keys(values: dict, source: str) -> dict:
    """Reject unknown keys with a did-you-mean; accept dashed spellings."""
    out = {}
    for key, value in values.items():
        name = _normalise_key(str(key))
        if name not in FIELDS:
            close = difflib.get_close_matches(name, FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: unknown setting {key!r}{hint}")
        out[name] = value
    return out


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return check_keys(values, str(path))


def build_config(cli_overrides: dict | None = None, config_file: str | None = None,
                 task_defaults: typing.Callable[[str, str | None], dict] | None = None) -> TrainConfig:
    """Defaults < task defaults < YAML file < typed CLI flags, then validated.

    task_defaults(task, model) gives the task's recommended settings; it is
    called once the task and model are known (the file or the CLI may choose
    them). With --data or --reward-file and no task named, the task is "custom".
    """
    cli = check_keys({k: v for k, v in (cli_overrides or {}).items() if v is not None}, "command line")
    from_file = load_yaml(config_file) if config_file else {}
    chosen = {**from_file, **cli}
    if "task" not in chosen:
        chosen["task"] = "custom" if chosen.get("data") or chosen.get("reward_file") else TrainConfig.task
    layered = {}
    if task_defaults is not None:
        layered.update(check_keys(task_defaults(str(chosen["task"]), chosen.get("model")), "task defaults"))
    layered.update(chosen)
    values = {name: _coerce(name, value) for name, value in layered.items()}
    config = TrainConfig(**values)
    validate(config)
    return config


def validate(c: TrainConfig) -> None:
    """Ranges and combinations; the first problem found is raised."""

    def need(ok: bool, message: str):
        if not ok:
            raise ConfigError(message)

    for name in ("steps", "batch_size", "group_size", "max_tokens", "num_iterations",
                 "micro_batch_size", "decode_concurrency", "save_every", "eval_num_problems",
                 "lora_rank", "log_every", "keep_checkpoints"):
        need(getattr(c, name) >= 1, f"{name} must be at least 1, got {getattr(c, name)}")
    for name in ("warmup_steps", "eval_steps", "top_k", "weight_decay", "beta", "min_p", "kl_every"):
        need(getattr(c, name) >= 0, f"{name} must be >= 0, got {getattr(c, name)}")
    need(c.group_size >= 2, "group_size must be at least 2: the group mean is the baseline, "
         "so a group of 1 always has advantage 0 and nothing is learned")
    need(c.temperature > 0, f"temperature must be > 0 for training rollouts, got {c.temperature}")
    need(0 < c.top_p <= 1, f"top_p must be in (0, 1], got {c.top_p}")
    need(c.min_p < 1, f"min_p must be < 1, got {c.min_p}")
    need(c.lr > 0, f"lr must be > 0, got {c.lr}")
    need(c.max_grad_norm > 0, f"max_grad_norm must be > 0, got {c.max_grad_norm}")
    need(0 <= c.epsilon_low < 1, f"epsilon_low must be in [0, 1), got {c.epsilon_low}")
    need(c.epsilon_high >= 0, f"epsilon_high must be >= 0, got {c.epsilon_high}")
    need(0 <= c.min_lr_ratio <= 1, f"min_lr_ratio must be in [0, 1], got {c.min_lr_ratio}")
    need(0 <= c.lora_dropout < 1, f"lora_dropout must be in [0, 1), got {c.lora_dropout}")
    need(c.scale_eps > 0, f"scale_eps must be > 0, got {c.scale_eps}")
    need(c.loss in LOSS_TYPES, f"loss must be one of {', '.join(LOSS_TYPES)}; got {c.loss!r}")
    need(c.scale_rewards in SCALE_MODES,
         f"scale_rewards must be one of {', '.join(SCALE_MODES)}; got {c.scale_rewards!r}")
    need(c.fine_tune_type in FINE_TUNE_TYPES,
         f"fine_tune_type must be one of {', '.join(FINE_TUNE_TYPES)}; got {c.fine_tune_type!r}")
    need(c.logprob_chunk_size is None or c.logprob_chunk_size >= 1, "logprob_chunk_size must be >= 1")
    if c.reward_weights is not None:
        need(len(c.reward_weights) == len(c.reward),
             f"reward_weights has {len(c.reward_weights)} entries but {len(c.reward)} rewards are named")
    if c.reward_file:
        need(Path(c.reward_file).is_file(), f"reward file not found: {c.reward_file}")
        need(bool(c.reward), "--reward-file needs --reward NAME (the function(s) to use from it)")


def to_dict(c: TrainConfig) -> dict:
    return dataclasses.asdict(c)


def dump_yaml(c: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(c), sort_keys=False)
