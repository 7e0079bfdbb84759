"""The checks a training configuration must pass: each value's type, ranges, combinations, installed loggers.

config.py builds a TrainConfig in layers, converting each value with `coerce`, and calls `validate` on
the result; the checks live here so that the settings and their rules can each be read on one page.
"""

from __future__ import annotations

import importlib.util
import math
import types
import typing
from pathlib import Path
from types import SimpleNamespace

from .errors import ConfigError
from .models.adapters import FINE_TUNE_TYPES
from .update.advantages import SCALE_MODES
from .update.losses import LOSS_TYPES

# rewards/web_browsing/env.py's PAYS (a test keeps both equal)
WEB_REWARDS = ("partial", "solved", "progress")
SHAPING = ("always", "gated", "scaled")  # tasks/shaping.py applies them
TOOL_STYLES = (
    "hermes",
    "llama3",
    "mistral",
)  # tools/calls.py reads them (STYLES there; a test keeps both equal)


def validate(config) -> None:
    """Ranges and combinations of a config.TrainConfig; the first problem found is raised. The
    checks read each setting by its flat name (config.flat()), the name their messages give."""
    c = SimpleNamespace(**config.flat())

    def need(ok: bool, message: str):
        if not ok:
            raise ConfigError(message)

    for name, value in vars(c).items():  # every setting by its flat name, a group's included
        for v in value if isinstance(value, list) else [value]:
            need(not isinstance(v, float) or math.isfinite(v), f"{name} must be a finite number, got {v}")
            # MLX keeps counts in 32-bit integers; the seed is the one 64-bit number.
            need(not isinstance(v, int) or name == "seed" or abs(v) < 2**31, f"{name} is too large: {v}")
    need(
        c.max_turns >= 1 and c.max_episode_tokens >= 1, "max_turns and max_episode_tokens must be at least 1"
    )
    need(
        c.web_reward in WEB_REWARDS,
        f"web_reward must be one of {', '.join(WEB_REWARDS)}; got {c.web_reward!r}",
    )
    need(
        c.web_reward == "partial" or c.task == "web",
        f"web_reward chooses how the web task pays its episodes; task is {c.task!r}",
    )
    need(c.curriculum in ("none", "ued"), f"curriculum must be none or ued; got {c.curriculum!r}")
    need(c.tool_timeout > 0, f"tool_timeout must be > 0 seconds, got {c.tool_timeout}")
    need(
        c.tool_style in (None, *TOOL_STYLES),
        f"tool_style must be one of {', '.join(TOOL_STYLES)}; got {c.tool_style!r}",
    )
    need(c.shaping in SHAPING, f"shaping must be one of {', '.join(SHAPING)}; got {c.shaping!r}")
    need(
        c.prefilter == 0 or c.prefilter >= 2,
        f"prefilter must be 0 (off) or at least 2 samples a prompt, got {c.prefilter}",
    )
    need(c.prefilter_prompts >= 0, f"prefilter_prompts must be >= 0 (0: all), got {c.prefilter_prompts}")
    need(c.prefilter_prompts == 0 or c.prefilter > 0, "prefilter_prompts needs --prefilter K")
    need(not (c.overwrite and c.resume), "--overwrite starts a run again and --resume continues it: give one")
    need(
        not c.guide or c.group_size >= 2,
        "guide needs group_size >= 2 (one member becomes the reference answer)",
    )
    need(
        c.guide or c.guide_negatives,
        "guide_negatives: false changes guided groups only: it needs guide: true",
    )
    need(c.guide_shaping >= 0, "guide_shaping must be >= 0 (0: off)")
    need(
        c.guide or not c.guide_shaping,
        "guide_shaping changes the references' tokens only: it needs guide: true",
    )
    need(
        c.warm_start_steps >= 0, f"warm_start_steps must be >= 0 (0: no warm start), got {c.warm_start_steps}"
    )
    need(
        c.warm_start_lr > 0 and c.warm_start_batch_size >= 1,
        "warm_start_lr must be > 0 and warm_start_batch_size at least 1",
    )
    need(
        not c.warm_start_web_kinds or c.task == "web",
        f"warm_start_web_kinds chooses the web task's demonstrations; task is {c.task!r}",
    )
    need(0 <= c.curriculum_explore <= 1, f"curriculum_explore must be in [0, 1], got {c.curriculum_explore}")
    for name in (
        "steps",
        "batch_size",
        "group_size",
        "max_tokens",
        "num_iterations",
        "micro_batch_size",
        "decode_concurrency",
        "save_every",
        "eval_num_problems",
        "lora_rank",
        "log_every",
        "keep_checkpoints",
    ):
        need(getattr(c, name) >= 1, f"{name} must be at least 1, got {getattr(c, name)}")
    for name in (
        "warmup_steps",
        "eval_steps",
        "top_k",
        "weight_decay",
        "beta",
        "min_p",
        "kl_every",
        "time_limit_minutes",
    ):
        need(getattr(c, name) >= 0, f"{name} must be >= 0, got {getattr(c, name)}")
    need(
        c.group_size >= 2,
        "group_size must be at least 2: the group mean is the baseline, "
        "so a group of 1 always has advantage 0 and nothing is learned",
    )
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
    _validate_health(c, need)
    need(c.loss in LOSS_TYPES, f"loss must be one of {', '.join(LOSS_TYPES)}; got {c.loss!r}")
    need(
        c.delta is None or c.delta > 1 + c.epsilon_high,
        f"delta must be > 1 + epsilon_high = {1 + c.epsilon_high}, got {c.delta}",
    )
    need(c.sapo_tau_pos > 0 and c.sapo_tau_neg > 0, "sapo_tau_pos and sapo_tau_neg must be > 0")
    need(c.entropy_coef >= 0, f"entropy_coef must be >= 0, got {c.entropy_coef}")
    need(
        0 < c.entropy_top_quantile <= 1,
        f"entropy_top_quantile must be in (0, 1], got {c.entropy_top_quantile}",
    )
    need(c.ref_refresh_every >= 0, f"ref_refresh_every must be >= 0, got {c.ref_refresh_every}")
    need(0 < c.ref_refresh_alpha <= 1, f"ref_refresh_alpha must be in (0, 1], got {c.ref_refresh_alpha}")
    need(0 <= c.runaway_penalty <= 1, f"runaway_penalty must be in [0, 1] (1: off), got {c.runaway_penalty}")
    # Below the task's token budget too (max_tokens, or max_episode_tokens for episodes):
    # registry.check_settings_apply.
    need(c.overlong_buffer >= 0, f"overlong_buffer must be >= 0, got {c.overlong_buffer}")
    need(c.eval_pass_k >= 0, f"eval_pass_k must be >= 0, got {c.eval_pass_k}")
    need(c.overlong_penalty >= 0, f"overlong_penalty must be >= 0, got {c.overlong_penalty}")
    need(c.resample_rounds >= 0, f"resample_rounds must be >= 0, got {c.resample_rounds}")
    need(c.resample_rounds == 0 or c.dynamic_sampling, "resample_rounds needs --dynamic-sampling")
    need(
        c.scale_rewards in SCALE_MODES,
        f"scale_rewards must be one of {', '.join(SCALE_MODES)}; got {c.scale_rewards!r}",
    )
    need(
        c.fine_tune_type in FINE_TUNE_TYPES,
        f"fine_tune_type must be one of {', '.join(FINE_TUNE_TYPES)}; got {c.fine_tune_type!r}",
    )
    need(c.logprob_chunk_size is None or c.logprob_chunk_size >= 1, "logprob_chunk_size must be >= 1")
    need(0 <= c.seed < 2**63, f"seed must be in [0, 2**63), got {c.seed}")
    need(
        c.lora_layers == -1 or c.lora_layers >= 1,
        f"lora_layers must be -1 (all) or at least 1, got {c.lora_layers}",
    )
    need(c.on_bad_data in ("skip", "error"), f"on_bad_data must be skip or error; got {c.on_bad_data!r}")
    need(c.max_prompt_tokens is None or c.max_prompt_tokens >= 1, "max_prompt_tokens must be >= 1")
    need(
        c.prompt_format is None or "{prompt}" in c.prompt_format,
        "prompt_format must contain {prompt}, where the prompt goes",
    )
    need(all(isinstance(s, str) and s for s in c.stop), "stop strings must be non-empty")
    need(c.reward_timeout >= 0, f"reward_timeout must be >= 0 (0: no limit), got {c.reward_timeout}")
    need(
        not c.keep_best or 0 < c.eval_steps < c.steps,
        f"keep_best needs 0 < eval_steps < steps (it keeps the best checkpoint evaluated during training); "
        f"got eval_steps {c.eval_steps}, steps {c.steps}",
    )
    if c.reward_weights is not None and c.reward:  # else the task's own rewards: load_task checks the count
        need(
            len(c.reward_weights) == len(c.reward),
            f"reward_weights has {len(c.reward_weights)} entries but {len(c.reward)} rewards are named",
        )
    need(
        c.judge_rubric is None or bool(c.judge), "--judge-rubric needs --judge MODEL (the model that grades)"
    )
    if c.reward_file:
        need(Path(c.reward_file).is_file(), f"reward file not found: {c.reward_file}")
        need(bool(c.reward), "--reward-file needs --reward NAME (the function(s) to use from it)")


def _validate_health(c, need) -> None:
    """The health thresholds and --report-to (a logger must be installed when asked for)."""
    need(c.health_window >= 2, f"health_window must be at least 2, got {c.health_window}")
    need(c.max_nonfinite_steps >= 0, f"max_nonfinite_steps must be >= 0, got {c.max_nonfinite_steps}")
    for name in (
        "health_spike_factor",
        "health_reward_drop",
        "health_loss_spike",
        "health_kl_max",
        "health_adv_factor",
        "health_min_update",
    ):
        need(getattr(c, name) >= 0, f"{name} must be >= 0, got {getattr(c, name)}")
    for name in (
        "health_clip_frac",
        "health_zero_std",
        "health_entropy_drop",
        "health_truncated_frac",
        "health_judge_unreadable",
        "health_takeover_share",
        "health_collapse_share",
        "health_tool_parse_fail",
        "health_tool_call_drop",
        "health_closed_book",
    ):
        need(0 <= getattr(c, name) <= 1, f"{name} must be in [0, 1], got {getattr(c, name)}")
    problem = check_reporters(c.report_to)
    need(problem is None, problem or "")


def coerce(name: str, value, hint):
    """Check/convert one value of the setting `name` to its field's type `hint`, with a clear message."""
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    union_args = typing.get_args(hint) if union else ()
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
                value = [
                    v.replace("\\n", "\n").replace("\\t", "\t") if isinstance(v, str) else v for v in value
                ]
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


# --report-to: the optional loggers (run/reporting.py runs them) and the package each needs.
REPORTERS = {
    "wandb": ("wandb", "pip install wandb"),
    "tensorboard": ("tensorboardX", "pip install tensorboardX"),
}


def check_reporters(names: list[str]) -> str | None:
    """What is wrong with --report-to, or None."""
    for name in names:
        if name not in REPORTERS:
            return f"report_to: unknown logger {name!r}; choose from {', '.join(REPORTERS)}"
        module, install = REPORTERS[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken or half-imported package
            found = False
        if not found:
            return f"--report-to {name}: {module} is not installed ({install})"
    return None
