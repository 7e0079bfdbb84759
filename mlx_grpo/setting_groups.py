"""Groups of settings: the dataclasses TrainConfig (config.py) holds its settings of one concern in.

Each class here is the one definition of its settings (name, default, help text): the layer that
uses a group takes it as it is. The sampler's settings class is SamplingSettings (sampling/rollout.py
names it SamplingConfig); the health rules read HealthSettings (run/health.py's Thresholds holds
the group). A group is one field of TrainConfig (`sampling`, `task_options`, `objective`,
`health`, `warm_start`); code reads `config.sampling.temperature`, `config.health.window`.

A user sees each setting by its flat name: a flag (--temperature, --health-window), a YAML key
(a YAML file may also give a group as a mapping, `health: {window: 4}`), a row of docs/settings.md,
a line of a run's config.yaml. GROUPS maps a group to its dataclass and the prefix of its flat
names (health_, or none); GROUP_KEYS, made from it, routes each flat name to its group, and
flat_settings, grouped_settings and flat_fields (config.py's flat, from_flat and FIELDS) use it.
COMMAND_READS says which settings each command reads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass, field
from functools import partial


def setting(default=MISSING, about: str = ""):
    """A setting's dataclass field: its default and its help text, kept in the field's metadata ("help"),
    the one description `--help`, docs/settings.md and docs/commands.md show (config.field_help reads it).
    A list default is a fresh copy for each config."""
    if isinstance(default, list):
        return field(default_factory=partial(list, default), metadata={"help": about})
    return field(default=default, metadata={"help": about})


@dataclass
class SamplingSettings:
    """How a rollout is sampled; flat names, unprefixed. The sampler takes this class itself
    (sampling/rollout.py's SamplingConfig is this class): a run gives it `config.sampling`."""

    temperature: float = setting(1.0, "sampling temperature; log-probs are taken at the same temperature")
    top_p: float = setting(1.0, "nucleus sampling (1: off)")
    top_k: int = setting(0, "top-k sampling (0: off)")
    min_p: float = setting(0.0, "min-p sampling (0: off)")
    max_tokens: int = setting(256, "completion length limit")


@dataclass
class TaskOptions:
    """A built-in task's own options (the web and multihop tasks read them): flat names, unprefixed, each
    beginning with its task's name (task_options_of reads them by it)."""

    web_kinds: list[str] = setting(
        [], "web task: only these families/levels (fact/1 ... account/3); empty: all"
    )
    web_reward: str = setting(
        "partial",
        "web task: what an unsolved episode's success pays: partial (the fraction of the task's "
        "constraints met) | solved (nothing) | progress (the constraints met beyond submitting the "
        "untouched form, as a fraction of the rest)",
    )
    multihop_hops: list[int] = setting(
        [], "multihop task: questions of these many hops (2, 3, 4); empty: all"
    )
    multihop_chains: list[str] = setting(
        [], "multihop task: only these chains of relations (city/country, founder/born_in, ...); empty: all"
    )


def task_options_of(task: str | None) -> tuple[str, ...]:
    """The TaskOptions a built-in task reads: those named after it (web_kinds and web_reward for web)."""
    return tuple(f.name for f in dataclasses.fields(TaskOptions) if f.name.startswith(f"{task}_"))


TASK_OPTIONS = tuple(f.name for f in dataclasses.fields(TaskOptions))


@dataclass
class ObjectiveSettings:
    """The objective: the loss, its clipping, KL and entropy terms, advantage scaling and the
    reference's refresh; flat names, unprefixed. update_settings (run/step_update.py) turns the
    group into the update's LossSettings and UpdateSettings."""

    loss: str = setting("grpo", "grpo | bnpo | dr_grpo | dapo | cispo | gspo | sapo (docs/algorithms.md)")
    num_iterations: int = setting(1, "updates per rollout batch (>1 reuses rollouts; the ratio matters)")
    epsilon_low: float = setting(0.2, "ratio clipped below at 1 - epsilon_low")
    epsilon_high: float = setting(0.2, "ratio clipped above at 1 + epsilon_high (clip-higher: > epsilon_low)")
    beta: float = setting(0.0, "KL(k3) weight to the reference model")
    kl_every: int = setting(
        10,
        "with beta = 0, measure KL to the reference every N steps (0: never; full "
        "fine-tuning keeps a copy of the starting weights for it)",
    )
    scale_rewards: str = setting("none", "none | group | batch")
    scale_eps: float = setting(1e-4, "added to the std when scaling advantages")
    delta: float | None = setting(
        None, "two-sided cap on the unclipped ratio, PPO-clip losses (None: off; > 1 + epsilon_high)"
    )
    sapo_tau_pos: float = setting(1.0, "sapo: gate temperature for tokens with positive advantage")
    sapo_tau_neg: float = setting(1.05, "sapo: gate temperature for tokens with negative advantage")
    entropy_coef: float = setting(0.0, "entropy bonus weight (0: off); the entropy is logged either way")
    entropy_top_quantile: float = setting(
        1.0, "train only on this top fraction of tokens by entropy (0.2: top 20%; 1: all)"
    )
    ref_refresh_every: int = setting(
        0, "move the reference toward the policy every N steps (0: never; the base stays)"
    )
    ref_refresh_alpha: float = setting(
        0.6, "on refresh: reference = alpha * policy + (1 - alpha) * reference"
    )


@dataclass
class HealthSettings:
    """When the health rules warn (docs/health.md). Each is the flat setting health_<name> (a flag,
    a YAML key, a docs/settings.md row); run/health.py's rules read this group itself."""

    window: int = setting(10, "steps each health rule looks back over")
    clip_frac: float = setting(0.8, "grad norm at max_grad_norm on more than this fraction of the window")
    spike_factor: float = setting(10.0, "grad norm above this multiple of its running median")
    zero_std: float = setting(0.5, "mean fraction of groups with identical rewards above this")
    reward_drop: float = setting(
        0.5, "reward/mean falls by more than this many within-batch stds over 2 windows"
    )
    loss_spike: float = setting(
        0.5, "|mean loss| grows by more than this fraction from one window to the next"
    )
    kl_max: float = setting(1.0, "KL to the reference above this and still rising")
    entropy_drop: float = setting(0.1, "token entropy below this fraction of its value over the first window")
    truncated_frac: float = setting(
        0.5, "mean fraction of completions cut at max_tokens (episodes at max_episode_tokens) above this"
    )
    adv_factor: float = setting(10.0, "largest |advantage| above this multiple of the batch's reward range")
    min_update: float = setting(
        1e-4, "updates move the weights by less than this fraction of their norm, reward flat"
    )
    judge_unreadable: float = setting(
        0.2, "the judge's answers could not be read as a score more often than this"
    )
    takeover_share: float = setting(
        0.5, "a side reward carries more than this share of the within-group reward variance"
    )
    collapse_share: float = setting(
        0.5, "one answer is more than this share of completions, or lengths fall below it"
    )
    tool_parse_fail: float = setting(
        0.9, "tool episodes: more than this share of attempted calls could not be read"
    )
    tool_call_drop: float = setting(
        0.1, "tool calls per episode fell below this fraction of their earlier level"
    )
    closed_book: float = setting(0.5, "tool episodes: more than this share answered without any call")


@dataclass
class WarmStartSettings:
    """A supervised warm start inside `train` (docs/sft.md): sft's stage on demonstrations first, in
    RUN/warm_start, then GRPO continues from it. Each is the flat setting warm_start_<name>;
    run/warm_start.py reads the group."""

    steps: int = setting(
        0, "supervised steps on demonstrations before GRPO, in RUN/warm_start (0: no warm start)"
    )
    lr: float = setting(
        1e-4,
        "the warm start's peak learning rate (its own schedule: warmup_steps, then "
        "cosine to lr * min_lr_ratio)",
    )
    batch_size: int = setting(4, "demonstrations per warm-start step")
    data: str | None = setting(
        None,
        "the warm start's demonstrations, as `sft --data` reads them with this "
        "task; None: the task's own (train split)",
    )
    web_kinds: list[str] = setting(
        [],
        "web task: the warm start's demonstrations from these kinds only "
        "(fact/1 ...); empty: the run's web_kinds",
    )


# The setting groups: TrainConfig field -> (its dataclass, the prefix of its settings' flat names).
# A flat name (a flag, a YAML key, a docs/settings.md row) maps to its group: health_window is health.window.
GROUPS: dict[str, tuple[type, str]] = {
    "sampling": (SamplingSettings, ""),
    "task_options": (TaskOptions, ""),
    "objective": (ObjectiveSettings, ""),
    "health": (HealthSettings, "health_"),
    "warm_start": (WarmStartSettings, "warm_start_"),
}
# flat name -> (group, field in the group)
GROUP_KEYS = {
    prefix + f.name: (group, f.name)
    for group, (kind, prefix) in GROUPS.items()
    for f in dataclasses.fields(kind)
}


def flat_settings(config) -> dict:
    """Every setting of a config (TrainConfig) by its flat name, a group's settings where the group is."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in GROUPS:
            out.update({GROUPS[f.name][1] + k: v for k, v in dataclasses.asdict(value).items()})
        else:
            out[f.name] = value
    return out


def grouped_settings(values: dict) -> tuple[dict, dict]:
    """(own, groups) of settings by their flat names: those that are no group's as given, and each group
    (TrainConfig field -> a new group object) with its given settings (GROUP_KEYS), the others at default."""
    own = {k: v for k, v in values.items() if k not in GROUP_KEYS}
    groups = {
        group: kind(
            **{
                GROUP_KEYS[k][1]: v
                for k, v in values.items()
                if k in GROUP_KEYS and GROUP_KEYS[k][0] == group
            }
        )
        for group, (kind, _) in GROUPS.items()
    }
    return own, groups


def flat_fields(config_class) -> dict[str, dataclasses.Field]:
    """Every setting by its flat name, in the config class's (TrainConfig's) order, a group's settings where
    the group is."""
    out = {}
    for f in dataclasses.fields(config_class):
        if f.name in GROUPS:
            kind, prefix = GROUPS[f.name]
            out.update({prefix + g.name: g for g in dataclasses.fields(kind)})
        else:
            out[f.name] = f
    return out


# The settings each command reads, by flat name or by group (a group's name: all its settings;
# EVERY_SETTING: all of them). Typed as a flag, a setting a command does not read is refused in one line
# that names the commands that read it (cli.py). A YAML file is a recipe the commands share
# (`sft --config configs/ocaml.yaml`, `compare --config`): a setting of it that the command does not read
# is left out of that command's config (config.build_config), and sft says which.
EVERY_SETTING = "*"
# eval and compare read these from a run's config.yaml or a --config file (evaluation/model_names.py): the
# task and its prompts, how the answers are sampled, the guards of the task (run/setup.py's guard_task: the
# same rows, the same reward time limit), and how the run computed with its weights (keep_quantized: its own
# check ran on them, so eval and compare answer on the same).
EVALUATION_READS = (
    "task",
    "data",
    "reward_file",
    "reward",
    "reward_weights",
    "system_prompt",
    "prompt_format",
    "stop",
    "task_options",
    "tools",
    "tool_timeout",
    "tool_style",
    "judge",
    "judge_rubric",
    "judge_weight",
    "sampling",
    "decode_concurrency",
    "eval_num_problems",
    "max_turns",
    "max_episode_tokens",
    "reward_timeout",
    "on_bad_data",
    "max_prompt_tokens",
    "keep_quantized",
)
COMMAND_READS: dict[str, tuple[str, ...]] = {
    "train": (EVERY_SETTING,),
    # Demonstrations of --data or of a task's own (its scripted episodes call tools: tool_timeout,
    # tool_style), the adapters and the optimizer as train's, and the held-out checks (max_tokens;
    # temperature for eval_pass_k; an episode's max_turns). Not the rollouts, the objective, the rewards or
    # the warm start.
    "sft": (
        "model",
        "task",
        "data",
        "tool_timeout",
        "tool_style",
        "system_prompt",
        "prompt_format",
        "stop",
        "on_bad_data",
        "steps",
        "batch_size",
        "max_tokens",
        "temperature",
        "decode_concurrency",
        "max_turns",
        "max_episode_tokens",
        "task_options",
        "fine_tune_type",
        "lora_rank",
        "lora_scale",
        "lora_dropout",
        "lora_layers",
        "keep_quantized",
        "lr",
        "warmup_steps",
        "min_lr_ratio",
        "weight_decay",
        "max_grad_norm",
        "micro_batch_size",
        "logprob_chunk_size",
        "seed",
        "output",
        "resume",
        "overwrite",
        "save_every",
        "keep_checkpoints",
        "eval_steps",
        "time_limit_minutes",
        "eval_num_problems",
        "eval_before",
        "eval_pass_k",
        "log_every",
        "report_to",
        "health",
        "max_nonfinite_steps",
    ),
    "eval": EVALUATION_READS,
    "compare": EVALUATION_READS,
}
