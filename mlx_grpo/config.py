"""Training configuration: one dataclass, filled in layers.

TrainConfig holds the run's settings; those of one concern are a group (setting_groups.py:
`sampling`, `task_options`, `objective`, `health`), read as config.sampling.temperature. Users
give every setting by its flat name (--temperature, health_window: 4); from_flat puts each in its
group, flat() gives them back, and with_settings(config, beta=0.1) is a changed copy.

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

from .config_checks import validate
from .errors import ConfigError  # noqa: F401 (defined below every floor; public here)
from .setting_groups import (GROUP_KEYS, GROUPS, HealthSettings, ObjectiveSettings, SamplingSettings, TaskOptions,
                             WarmStartSettings)


@dataclass
class TrainConfig:
    # What to train, on what
    model: str | None = None  # folder, GGUF file, ollama:/lmstudio: name, HF id or packaged model; None: embedded
    task: str = "arith"  # a built-in task, or "custom" with --data and --reward-file
    data: str | None = None  # JSONL file, folder with train.jsonl/test.jsonl, or a HF dataset name
    reward_file: str | None = None  # Python file defining reward functions
    reward: list[str] = field(default_factory=list)  # reward function names (from reward_file or the task)
    reward_weights: list[float] | None = None  # one per reward; default 1.0 each
    reward_timeout: float = 60.0  # seconds a reward call may take; then its examples count as failed (0: no limit)
    tools: str | None = None  # Python file whose public functions are tools: each row is a tool-calling episode
    tool_timeout: float = 10.0  # seconds a tool call may take; then the model reads a timeout error as its result
    tool_style: str | None = None  # how tool calls are read: hermes, llama3 or mistral (default: what the chat template teaches)
    system_prompt: str | None = None  # overrides the task's system prompt
    prompt_format: str | None = None  # plain-text frame for a model with no chat template (a base model): "{prompt}" marks the prompt
    stop: list[str] = field(default_factory=list)  # a completion also ends at a token whose text starts with one of these (e.g. "\n")
    on_bad_data: str = "skip"  # skip | error: what bad rows (malformed JSON, no prompt, too long, ...) do
    max_prompt_tokens: int | None = None  # longer prompts are bad rows; None: the model's context minus max_tokens

    # Rollouts
    steps: int = 100  # GRPO steps (one rollout batch each)
    batch_size: int = 8  # prompts per step
    group_size: int = 8  # completions per prompt
    sampling: SamplingSettings = field(default_factory=SamplingSettings)  # max_tokens ... min_p, one group (setting_groups.py)
    decode_concurrency: int = 256  # sequences decoded at once; independent of micro_batch_size
    max_turns: int = 8  # multi-turn tasks (web): the most model turns in one episode
    max_episode_tokens: int = 1024  # multi-turn tasks: the most tokens of an episode after its first prompt (turns and observations)
    curriculum: str = "none"  # none | ued: draw the prompts (or task groups) solved about half the time more often (docs/rare-rewards.md)
    curriculum_key: str = "kind"  # row column that groups tasks for the curriculum (web: kind, e.g. fact/1); rows without it, or all with "prompt", are a group each
    curriculum_explore: float = 0.2  # curriculum: share of draws spread evenly over all groups, whatever their estimates
    prefilter: int = 0  # sample this many answers to each training prompt from the base model first; train only on prompts solved in some but not all (0: off; docs/rare-rewards.md)
    prefilter_prompts: int = 0  # the most training prompts the prefilter samples, in the run's order (0: all)
    guide: bool = False  # in a group with no right answer, one member is the row's reference answer or scripted episode (off-policy guidance; docs/rare-rewards.md)
    guide_negatives: bool = True  # guide: the model's own (all wrong) answers in a guided group get their negative advantages; false: 0, the group trains the reference alone
    guide_shaping: float = 0.0  # guide: a reference token's term is A * p/(p + gamma) with gamma this (LUFFY's policy shaping; 0: off, trained like a sampled token)
    task_options: TaskOptions = field(default_factory=TaskOptions)  # web_kinds, multihop_*: one group (setting_groups.py)

    # Objective
    objective: ObjectiveSettings = field(default_factory=ObjectiveSettings)  # loss ... ref_refresh_alpha, one group (setting_groups.py)

    # Rewards and filtering
    runaway_penalty: float = 0.3  # reward factor for completions cut at max_tokens with no end marker, episodes cut at max_episode_tokens (1: off)
    mask_truncated: bool = False  # leave completions cut at max_tokens (episodes at max_episode_tokens) out of the loss
    overlong_buffer: int = 0  # DAPO soft overlong penalty over the last N tokens the model may write: before max_tokens, an episode's model tokens before max_episode_tokens (0: off)
    overlong_penalty: float = 1.0  # the soft overlong penalty reached at max_tokens (an episode's: max_episode_tokens)
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal from the batch
    resample_rounds: int = 0  # with dynamic_sampling: at most this many extra rollouts to refill the batch
    reward_threshold: float | None = None  # drop groups whose best reward is below this (seed 003; None: off)
    shaping: str = "always"  # always | gated | scaled: how side rewards (all but the first) count: everywhere, only in groups where the first varies, or times the first's place in its group (docs/rare-rewards.md)
    judge: str | None = None  # a model that grades completions, an extra reward named judge (any --model source; docs/judge.md)
    judge_rubric: str | None = None  # the judge's rubric: a file, or general / ocaml_quality (built in); default: the task's
    judge_weight: float = 1.0  # weight of the judge's reward (0: logged beside the others, not trained on)

    # Optimisation
    fine_tune_type: str = "lora"  # lora | dora | full
    lora_rank: int = 8  # LoRA rank
    lora_scale: float = 20.0  # LoRA output scale (mlx-lm's convention, not alpha)
    lora_dropout: float = 0.0  # dropout on the LoRA input
    lora_layers: int = -1  # how many of the last blocks get adapters; -1: all
    keep_quantized: bool = False  # keep a quantized base quantized on the CPU (default there: a float32 copy when it fits in memory, much faster); Metal/CUDA always keep it
    lr: float = 1e-5  # peak learning rate (AdamW)
    warmup_steps: int = 10  # linear warmup, in optimizer updates
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    weight_decay: float = 0.0  # AdamW weight decay
    max_grad_norm: float = 1.0  # global gradient-norm clip; the norm before clipping is logged
    skip_no_signal: bool = True  # skip the optimizer step and the lr schedule's tick when no group carries signal (none kept, or no advantage and no KL/entropy term): AdamW's moments would move the weights on a zero gradient
    micro_batch_size: int = 16  # sequences per forward/backward (on a CPU fewer when their activations would pass ~384 MiB; not for bnpo); gradients are accumulated; below group_size a group is cut into pieces (less memory, its prompt runs once a piece)
    logprob_chunk_size: int | None = None  # positions per vocabulary-projection chunk; None: automatic

    # Bookkeeping
    seed: int = 0  # the same seed gives the same run
    output: str | None = None  # run folder; default checkpoints/<task>-<time>
    resume: str | None = None  # run folder to continue
    overwrite: bool = False  # start again in an output folder that holds an earlier run: its run files are removed first (without it such a run stops; docs/runs.md); config.yaml records false
    save_every: int = 50  # checkpoint every N steps, and at the end
    keep_checkpoints: int = 2  # how many step checkpoints to keep
    keep_best: bool = False  # also keep the checkpoint with the best eval accuracy (needs eval_steps; the evaluation after the last step counts for its checkpoint)
    eval_steps: int = 0  # evaluate every N steps; 0: only before and after training
    time_limit_minutes: float = 0.0  # stop starting steps when one more (at the mean step time) and the final evaluation would end past this many minutes of the run; then save and evaluate as at the end (the lr schedule still spans `steps`); 0: no limit
    eval_num_problems: int = 200  # held-out problems for accuracy (greedy decoding)
    eval_before: bool = True  # measure the held-out accuracy before the first step (train, sft, a warm start's base); false: that time goes to training, but the summary and metrics have no 'before' accuracy (compare still measures the base), and under time_limit_minutes GRPO reserves time for its final check only once a check is timed (the warm start's last, or one every eval_steps)
    eval_pass_k: int = 0  # also sample k completions per held-out problem, log eval/pass@k (0: off)
    log_every: int = 1  # print a line every N steps when not on a terminal
    report_to: list[str] = field(default_factory=list)  # also log metrics to wandb and/or tensorboard (if installed)

    # Training health (docs/health.md): when the health rules warn
    health: HealthSettings = field(default_factory=HealthSettings)  # the health_* settings, one group (setting_groups.py)
    max_nonfinite_steps: int = 3  # stop after this many steps in a row with a NaN/Inf loss or gradient (0: never)

    # A supervised warm start before GRPO (docs/sft.md)
    warm_start: WarmStartSettings = field(default_factory=WarmStartSettings)  # the warm_start_* settings, one group (setting_groups.py)

    def flat(self) -> dict:
        """Every setting by its flat name (a flag, a YAML key): what config.yaml holds."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in GROUPS:
                out.update({GROUPS[f.name][1] + k: v for k, v in dataclasses.asdict(value).items()})
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_flat(cls, values: dict) -> "TrainConfig":
        """A config from settings by their flat names, each group's (health_window, beta, ...) put in
        its group (GROUP_KEYS); what is not given keeps its default. Not validated (build_config is)."""
        own = {k: v for k, v in values.items() if k not in GROUP_KEYS}
        groups = {group: kind(**{GROUP_KEYS[k][1]: v for k, v in values.items()
                                 if k in GROUP_KEYS and GROUP_KEYS[k][0] == group})
                  for group, (kind, _) in GROUPS.items()}
        return cls(**own, **groups)


def with_settings(config: TrainConfig, **flat) -> TrainConfig:
    """A copy of config with the settings given by their flat names changed (beta=0.1,
    health_window=4, temperature=0.7, lr=1e-4): a new TrainConfig with new group objects, the
    original untouched. An unknown name is a ConfigError; the result is not validated
    (config_checks.validate does that)."""
    return TrainConfig.from_flat({**config.flat(), **check_keys(flat, "with_settings")})


def _flat_fields() -> dict[str, dataclasses.Field]:
    """Every setting by its flat name, in TrainConfig's order, a group's settings where the group is."""
    out = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name in GROUPS:
            kind, prefix = GROUPS[f.name]
            out.update({prefix + g.name: g for g in dataclasses.fields(kind)})
        else:
            out[f.name] = f
    return out


FIELDS = _flat_fields()
JUDGE_KEYS = ("judge", "judge_rubric", "judge_weight")  # a judge reward's settings: train, eval and compare share them
_HINTS = {**typing.get_type_hints(TrainConfig),
          **{flat: typing.get_type_hints(GROUPS[group][0])[name] for flat, (group, name) in GROUP_KEYS.items()}}


def field_help() -> dict[str, str]:
    """Each setting's comment in TrainConfig above (a group's in its class): the one description, used by --help."""
    def comments(kind) -> dict[str, str]:
        return dict(re.findall(r"^\s+(\w+): [^=\n]+=[^#\n]+#\s*(.+)$", inspect.getsource(kind), flags=re.M))

    helps = {k: v for k, v in comments(TrainConfig).items() if k not in GROUPS}
    for kind, prefix in GROUPS.values():
        helps.update({prefix + k: v for k, v in comments(kind).items()})
    return helps


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
            if name == "stop" and isinstance(value, str):
                value = [value]  # one stop string (a comma or a space may be part of it)
            if name == "stop":  # typed on a command line, "\n" is two characters: a newline is meant
                value = [v.replace("\\n", "\n").replace("\\t", "\t") if isinstance(v, str) else v for v in value]
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


def _unknown(key, known, source: str) -> ConfigError:
    close = difflib.get_close_matches(_normalise_key(str(key)), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{source}: unknown setting {key!r}{hint}")


def check_keys(values: dict, source: str) -> dict:
    """Settings by their flat names: unknown keys rejected with a did-you-mean, dashed spellings
    accepted. A group may come as a mapping of its own names (health: {window: 4}, sampling:
    {temperature: 0.7}); a setting given both ways is refused."""
    out, nested = {}, {}
    for key, value in values.items():
        name = _normalise_key(str(key))
        if name in GROUPS and isinstance(value, dict):
            kind, prefix = GROUPS[name]
            names = [f.name for f in dataclasses.fields(kind)]
            for inner, v in value.items():
                short = _normalise_key(str(inner))
                if short not in names:
                    raise _unknown(inner, names, f"{source}: {name}")
                nested[prefix + short] = (f"{name}.{short}", v)
        elif name in GROUPS:
            raise ConfigError(f"{source}: {name}: expected a mapping of its settings ({name}: {{name: value}})")
        elif name not in FIELDS:
            raise _unknown(key, FIELDS, source)
        else:
            out[name] = value
    for flat, (spelled, value) in nested.items():
        if flat in out:
            raise ConfigError(f"{source}: {flat} is given twice, as {flat} and as {spelled}: give it once")
        out[flat] = value
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
    config = TrainConfig.from_flat(values)
    validate(config)
    return config


def to_dict(c: TrainConfig) -> dict:
    return c.flat()


def dump_yaml(c: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(c), sort_keys=False)
