"""Groups of settings: the dataclasses TrainConfig (config.py) holds its settings of one concern in.

A group is one field of TrainConfig (`sampling`: SamplingSettings, `health`: HealthSettings)
whose settings keep their flat names everywhere a user sees them: a flag (--health-window,
--temperature), a YAML key, a row of docs/settings.md, a line of a run's config.yaml. GROUPS
maps the field to its dataclass and the prefix of its flat names (none for sampling's);
config.py's FIELDS, build_config and TrainConfig.flat use it, and `config.health_window` still
reads `config.health.window`, `config.temperature` `config.sampling.temperature`. A layer that
needs a group takes it whole (run/health.py reads `config.health`; the sampler is given
`config.sampling`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class SamplingSettings:
    """How a rollout is sampled: the settings of the same names, flat (no prefix). The sampler's own
    SamplingConfig (sampling/rollout.py) takes them as they are: SamplingConfig(**asdict(config.sampling))."""

    max_tokens: int = 256  # completion length limit
    temperature: float = 1.0  # sampling temperature; log-probs are taken at the same temperature
    top_p: float = 1.0  # nucleus sampling (1: off)
    top_k: int = 0  # top-k sampling (0: off)
    min_p: float = 0.0  # min-p sampling (0: off)


@dataclass
class HealthSettings:
    """When the health rules warn (docs/health.md). Each is the flat setting health_<name>: a flag,
    a YAML key and a docs/settings.md row as before; run/health.py's rules read the group."""

    window: int = 10  # steps each health rule looks back over
    clip_frac: float = 0.8  # grad norm at max_grad_norm on more than this fraction of the window
    spike_factor: float = 10.0  # grad norm above this multiple of its running median
    zero_std: float = 0.5  # mean fraction of groups with identical rewards above this
    reward_drop: float = 0.5  # reward/mean falls by more than this many within-batch stds over 2 windows
    loss_spike: float = 0.5  # |mean loss| grows by more than this fraction from one window to the next
    kl_max: float = 1.0  # KL to the reference above this and still rising
    entropy_drop: float = 0.1  # token entropy below this fraction of its value over the first window
    truncated_frac: float = 0.5  # mean fraction of completions cut at max_tokens (episodes at max_episode_tokens) above this
    adv_factor: float = 10.0  # largest |advantage| above this multiple of the batch's reward range
    min_update: float = 1e-4  # updates move the weights by less than this fraction of their norm, reward flat
    judge_unreadable: float = 0.2  # the judge's answers could not be read as a score more often than this
    takeover_share: float = 0.5  # a side reward carries more than this share of the within-group reward variance
    collapse_share: float = 0.5  # one answer is more than this share of completions, or lengths fall below it
    tool_parse_fail: float = 0.9  # tool episodes: more than this share of attempted calls could not be read
    tool_call_drop: float = 0.1  # tool calls per episode fell below this fraction of their earlier level
    closed_book: float = 0.5  # tool episodes: more than this share answered without any call


# The setting groups: TrainConfig field -> (its dataclass, the prefix of its settings' flat names).
# A flat name (a flag, a YAML key, a docs/settings.md row) maps to its group: health_window is health.window.
GROUPS: dict[str, tuple[type, str]] = {"sampling": (SamplingSettings, ""), "health": (HealthSettings, "health_")}
# flat name -> (group, field in the group)
GROUP_KEYS = {prefix + f.name: (group, f.name) for group, (kind, prefix) in GROUPS.items()
              for f in dataclasses.fields(kind)}
