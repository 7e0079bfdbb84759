"""Training configuration: one dataclass, filled in layers.

TrainConfig holds the run's settings; those of one concern are a group (setting_groups.py:
`sampling`, `task_options`, `objective`, `health`), read as config.sampling.temperature. Users
give every setting by its flat name (--temperature, health_window: 4); from_flat puts each in its
group, flat() gives them back, and with_settings(config, beta=0.1) is a changed copy.

Precedence, lowest first: the defaults below, the task's recommended settings
(the embedded arith task tunes lr, max_tokens, ... for its tiny model), the
YAML file given with --config, then the flags typed on the command line. A
flag that is not typed never overrides anything. Each command reads its own
settings (setting_groups.COMMAND_READS, READS here): build_config refuses a
typed one it does not read and leaves out those of the file and the task.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .config_checks import coerce, validate
from .errors import ConfigError  # noqa: F401 (defined below every floor; public here)
from .setting_groups import (
    COMMAND_READS,
    EVERY_SETTING,
    GROUP_KEYS,
    GROUPS,
    HealthSettings,
    ObjectiveSettings,
    SamplingSettings,
    TaskOptions,
    WarmStartSettings,
    flat_fields,
    flat_settings,
    grouped_settings,
    setting,
)


@dataclass
class TrainConfig:
    # What to train, on what
    model: str | None = setting(
        None, "folder, GGUF file, ollama:/lmstudio: name, HF id or packaged model; None: embedded"
    )
    task: str = setting("arith", 'a built-in task, or "custom" with --data and --reward-file')
    data: str | None = setting(None, "JSONL file, folder with train.jsonl/test.jsonl, or a HF dataset name")
    reward_file: str | None = setting(None, "Python file defining reward functions")
    reward: list[str] = setting([], "reward function names (from reward_file or the task)")
    reward_weights: list[float] | None = setting(None, "one per reward; default 1.0 each")
    reward_timeout: float = setting(
        60.0, "seconds a reward call may take; then its examples count as failed (0: no limit)"
    )
    tools: str | None = setting(
        None, "Python file whose public functions are tools: each row is a tool-calling episode"
    )
    tool_timeout: float = setting(
        10.0, "seconds a tool call may take; then the model reads a timeout error as its result"
    )
    tool_style: str | None = setting(
        None, "how tool calls are read: hermes, llama3 or mistral (default: what the chat template teaches)"
    )
    system_prompt: str | None = setting(None, "overrides the task's system prompt")
    prompt_format: str | None = setting(
        None, 'plain-text frame for a model with no chat template (a base model): "{prompt}" marks the prompt'
    )
    stop: list[str] = setting(
        [], 'a completion also ends at a token whose text starts with one of these (e.g. "\\n")'
    )
    on_bad_data: str = setting(
        "skip", "skip | error: what bad rows (malformed JSON, no prompt, too long, ...) do"
    )
    max_prompt_tokens: int | None = setting(
        None, "longer prompts are bad rows; None: the model's context minus max_tokens"
    )

    # Rollouts
    steps: int = setting(100, "GRPO steps (one rollout batch each)")
    batch_size: int = setting(8, "prompts per step")
    group_size: int = setting(8, "completions per prompt")
    sampling: SamplingSettings = field(default_factory=SamplingSettings)  # max_tokens ... min_p, one group
    decode_concurrency: int = setting(256, "sequences decoded at once; independent of micro_batch_size")
    max_turns: int = setting(8, "multi-turn tasks (web): the most model turns in one episode")
    max_episode_tokens: int = setting(
        1024,
        "multi-turn tasks: the most tokens of an episode after its first prompt (turns and observations)",
    )
    curriculum: str = setting(
        "none",
        "none | ued: draw the prompts (or task groups) solved about half the "
        "time more often (docs/rare-rewards.md)",
    )
    curriculum_key: str = setting(
        "kind",
        "row column that groups tasks for the curriculum (web: kind, e.g. "
        'fact/1); rows without it, or all with "prompt", are a group each',
    )
    curriculum_explore: float = setting(
        0.2, "curriculum: share of draws spread evenly over all groups, whatever their estimates"
    )
    prefilter: int = setting(
        0,
        "sample this many answers to each training prompt from the base model "
        "first; train only on prompts solved in some but not all (0: off; "
        "docs/rare-rewards.md)",
    )
    prefilter_prompts: int = setting(
        0, "the most training prompts the prefilter samples, in the run's order (0: all)"
    )
    guide: bool = setting(
        False,
        "in a group with no right answer, one member is the row's reference answer "
        "or scripted episode (off-policy guidance; docs/rare-rewards.md)",
    )
    guide_negatives: bool = setting(
        True,
        "guide: the model's own (all wrong) answers in a guided group get "
        "their negative advantages; false: 0, the group trains the "
        "reference alone",
    )
    guide_shaping: float = setting(
        0.0,
        "guide: a reference token's term is A * p/(p + gamma) with gamma "
        "this (LUFFY's policy shaping; 0: off, trained like a sampled token)",
    )
    task_options: TaskOptions = field(default_factory=TaskOptions)  # web_kinds, multihop_*: one group

    # Objective
    objective: ObjectiveSettings = field(default_factory=ObjectiveSettings)  # loss ... ref_refresh_alpha

    # Rewards and filtering
    runaway_penalty: float = setting(
        0.3,
        "reward factor for completions cut at max_tokens with no end "
        "marker, episodes cut at max_episode_tokens (1: off)",
    )
    mask_truncated: bool = setting(
        False, "leave completions cut at max_tokens (episodes at max_episode_tokens) out of the loss"
    )
    overlong_buffer: int = setting(
        0,
        "DAPO soft overlong penalty over the last N tokens the model may "
        "write: before max_tokens, an episode's model tokens before "
        "max_episode_tokens (0: off)",
    )
    overlong_penalty: float = setting(
        1.0, "the soft overlong penalty reached at max_tokens (an episode's: max_episode_tokens)"
    )
    dynamic_sampling: bool = setting(False, "DAPO: drop groups whose rewards are all equal from the batch")
    resample_rounds: int = setting(
        0, "with dynamic_sampling: at most this many extra rollouts to refill the batch"
    )
    reward_threshold: float | None = setting(
        None, "drop groups whose best reward is below this (seed 003; None: off)"
    )
    shaping: str = setting(
        "always",
        "always | gated | scaled: how side rewards (all but the first) count: "
        "everywhere, only in groups where the first varies, or times the "
        "first's place in its group (docs/rare-rewards.md)",
    )
    judge: str | None = setting(
        None,
        "a model that grades completions, an extra reward named judge (any --model source; docs/judge.md)",
    )
    judge_rubric: str | None = setting(
        None, "the judge's rubric: a file, or general / ocaml_quality (built in); default: the task's"
    )
    judge_weight: float = setting(
        1.0, "weight of the judge's reward (0: logged beside the others, not trained on)"
    )

    # Optimisation
    fine_tune_type: str = setting("lora", "lora | dora | full")
    lora_rank: int = setting(8, "LoRA rank")
    lora_scale: float = setting(20.0, "LoRA output scale (mlx-lm's convention, not alpha)")
    lora_dropout: float = setting(0.0, "dropout on the LoRA input")
    lora_layers: int = setting(-1, "how many of the last blocks get adapters; -1: all")
    keep_quantized: bool = setting(
        False,
        "keep a quantized base quantized on the CPU (default there: a "
        "float32 copy when it fits in memory, much faster); Metal/CUDA "
        "always keep it",
    )
    lr: float = setting(1e-5, "peak learning rate (AdamW)")
    warmup_steps: int = setting(10, "linear warmup, in optimizer updates")
    min_lr_ratio: float = setting(0.1, "cosine decays to lr * min_lr_ratio")
    weight_decay: float = setting(0.0, "AdamW weight decay")
    max_grad_norm: float = setting(1.0, "global gradient-norm clip; the norm before clipping is logged")
    skip_no_signal: bool = setting(
        True,
        "skip the optimizer step and the lr schedule's tick when no group "
        "carries signal (none kept, or no advantage and no KL/entropy "
        "term): AdamW's moments would move the weights on a zero gradient",
    )
    micro_batch_size: int = setting(
        16,
        "sequences per forward/backward (on a CPU fewer when their "
        "activations would pass ~384 MiB; not for bnpo); gradients are "
        "accumulated; below group_size a group is cut into pieces (less "
        "memory, its prompt runs once a piece)",
    )
    logprob_chunk_size: int | None = setting(
        None, "positions per vocabulary-projection chunk; None: automatic"
    )

    # Bookkeeping
    seed: int = setting(0, "the same seed gives the same run")
    output: str | None = setting(None, "run folder; default checkpoints/<task>-<time>")
    resume: str | None = setting(None, "run folder to continue")
    overwrite: bool = setting(
        False,
        "start again in an output folder that holds an earlier run: its run "
        "files are removed first (without it such a run stops; docs/runs.md); "
        "config.yaml records false",
    )
    save_every: int = setting(50, "checkpoint every N steps, and at the end")
    keep_checkpoints: int = setting(2, "how many step checkpoints to keep")
    keep_best: bool = setting(
        False,
        "also keep the checkpoint with the best eval accuracy (needs "
        "eval_steps; the evaluation after the last step counts for its "
        "checkpoint)",
    )
    eval_steps: int = setting(0, "evaluate every N steps; 0: only before and after training")
    time_limit_minutes: float = setting(
        0.0,
        "stop starting steps when one more (at the mean step time) and "
        "the final evaluation would end past this many minutes of the "
        "run; then save and evaluate as at the end (the lr schedule "
        "still spans `steps`); 0: no limit",
    )
    eval_num_problems: int = setting(200, "held-out problems for accuracy (greedy decoding)")
    eval_before: bool = setting(
        True,
        "measure the held-out accuracy before the first step (train, sft, a "
        "warm start's base); false: that time goes to training, but the "
        "summary and metrics have no 'before' accuracy (compare still "
        "measures the base), and under time_limit_minutes GRPO reserves time "
        "for its final check only once a check is timed (the warm start's "
        "last, or one every eval_steps)",
    )
    eval_pass_k: int = setting(0, "also sample k completions per held-out problem, log eval/pass@k (0: off)")
    log_every: int = setting(1, "print a line every N steps when not on a terminal")
    report_to: list[str] = setting([], "also log metrics to wandb and/or tensorboard (if installed)")

    # Training health (docs/health.md): when the health rules warn
    health: HealthSettings = field(default_factory=HealthSettings)  # the health_* settings, one group
    max_nonfinite_steps: int = setting(
        3, "stop after this many steps in a row with a NaN/Inf loss or gradient (0: never)"
    )

    # A supervised warm start before GRPO (docs/sft.md)
    warm_start: WarmStartSettings = field(default_factory=WarmStartSettings)  # the warm_start_* settings

    def flat(self) -> dict:
        """Every setting by its flat name (a flag, a YAML key): what config.yaml holds."""
        return flat_settings(self)

    @classmethod
    def from_flat(cls, values: dict) -> "TrainConfig":
        """A config from settings by their flat names, each group's (health_window, beta, ...) put in
        its group (GROUP_KEYS); what is not given keeps its default. Not validated (build_config is)."""
        own, groups = grouped_settings(values)
        return cls(**own, **groups)


def with_settings(config: TrainConfig, **flat) -> TrainConfig:
    """A copy of config with the settings given by their flat names changed (beta=0.1,
    health_window=4, temperature=0.7, lr=1e-4): a new TrainConfig with new group objects, the
    original untouched. An unknown name is a ConfigError; the result is not validated
    (config_checks.validate does that)."""
    return TrainConfig.from_flat({**config.flat(), **check_keys(flat, "with_settings")})


FIELDS = flat_fields(TrainConfig)  # every setting by its flat name, in TrainConfig's order
# the judge's settings: train, eval and compare read them
JUDGE_KEYS = ("judge", "judge_rubric", "judge_weight")
_HINTS = {
    **typing.get_type_hints(TrainConfig),
    **{flat: typing.get_type_hints(GROUPS[group][0])[name] for flat, (group, name) in GROUP_KEYS.items()},
}


def _expand(names: tuple[str, ...]) -> frozenset[str]:
    """Flat names of COMMAND_READS' entries: a group's name is all its settings, EVERY_SETTING all of them."""
    out = set()
    for name in names:
        if name == EVERY_SETTING:
            out |= set(FIELDS)
        elif name in GROUPS:
            out |= {GROUPS[name][1] + f.name for f in dataclasses.fields(GROUPS[name][0])}
        elif name in FIELDS:
            out.add(name)
        else:
            raise ValueError(f"setting_groups.COMMAND_READS names {name!r}, neither a setting nor a group")
    return frozenset(out)


READS = {command: _expand(names) for command, names in COMMAND_READS.items()}  # command -> the flat names


def readers(name: str) -> list[str]:
    """The commands that read the setting `name`, in COMMAND_READS' order."""
    return [command for command, names in READS.items() if name in names]


def not_read(command: str, name: str) -> str:
    """The line that refuses a setting `command` does not read ("sft does not read group_size (train reads
    it)")."""
    who = readers(name)
    them = who[0] if len(who) == 1 else ", ".join(who[:-1]) + " and " + who[-1]
    return f"{command} does not read {name} ({them} read{'s' if len(who) == 1 else ''} it)"


def file_settings_not_read(config_file: str | None, command: str) -> list[str]:
    """The settings a YAML file sets to other than their defaults that `command` does not read: it leaves
    them out (build_config)."""
    values = load_yaml(config_file) if config_file else {}
    return [
        name
        for name, value in values.items()
        if name not in READS[command] and coerce(name, value, _HINTS[name]) != _default(name)
    ]


def _default(name: str):
    f = FIELDS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def field_help() -> dict[str, str]:
    """Each setting's help text, by flat name: its field's metadata (setting_groups.setting), the one
    description `--help` and docs/settings.md show."""
    return {name: f.metadata["help"] for name, f in FIELDS.items()}


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
            raise ConfigError(
                f"{source}: {name}: expected a mapping of its settings ({name}: {{name: value}})"
            )
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


def build_config(
    cli_overrides: dict | None = None,
    config_file: str | None = None,
    task_defaults: typing.Callable[[str, str | None], dict] | None = None,
    command: str = "train",
) -> TrainConfig:
    """Defaults < task defaults < YAML file < typed CLI flags, then validated.

    task_defaults(task, model) gives the task's recommended settings; it is
    called once the task and model are known (the file or the CLI may choose
    them). With --data or --reward-file and no task named, the task is "custom".
    `command` reads the settings COMMAND_READS gives it: a typed one it does not
    read is refused (not_read); one of the file or the task's it does not read is
    left out, so it keeps its default.
    """
    reads = READS[command]
    cli = check_keys({k: v for k, v in (cli_overrides or {}).items() if v is not None}, "command line")
    refused = next((name for name in cli if name not in reads), None)
    if refused is not None:
        raise ConfigError(not_read(command, refused))
    from_file = load_yaml(config_file) if config_file else {}
    chosen = {k: v for k, v in {**from_file, **cli}.items() if k in reads}
    if "task" not in chosen:
        chosen["task"] = "custom" if chosen.get("data") or chosen.get("reward_file") else TrainConfig.task
    layered = {}
    if task_defaults is not None:
        recommended = check_keys(task_defaults(str(chosen["task"]), chosen.get("model")), "task defaults")
        layered.update({k: v for k, v in recommended.items() if k in reads})
    layered.update(chosen)
    values = {name: coerce(name, value, _HINTS[name]) for name, value in layered.items()}
    config = TrainConfig.from_flat(values)
    validate(config)
    return config


def to_dict(c: TrainConfig) -> dict:
    return c.flat()


def dump_yaml(c: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(c), sort_keys=False)
