"""Training health: rules that read the recent step metrics and say what is going wrong.

Each rule looks at the metrics of the last steps (a window of `health_window`
steps, or a longer history where it needs one) and returns a line of evidence
when it fires. The monitor reports a rule once when it starts firing, and again
only after it has been quiet for a whole window. Every rule carries the seed
write-up that motivated it; docs/health.md explains each one. The rules' checks are
health_checks.py's, health_rewards.py's and health_tools.py's; this module registers them (RULES)
and runs them (HealthMonitor).

Metric keys are the trainer's (see trainer.train_step); a missing or None value
is simply not evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import TrainConfig
from ..files import read_run_records, training_rows
from ..setting_groups import HealthSettings
from .health_checks import (
    _number,
    advantage_blowup,
    entropy_collapse,
    grad_at_clip,
    grad_spike,
    judge_unreadable,
    kl_runaway,
    loss_spike,
    lr_too_low,
    reward_collapse,
    reward_down,
    truncated,
    zero_std,
)
from .health_rewards import REWARD_RULES
from .health_tools import TOOL_RULES


@dataclass
class Thresholds:
    """What the rules compare against: the health group itself (when they fire: window, clip_frac, ...,
    TrainConfig's health_* settings) and facts about the run."""

    health: HealthSettings = field(default_factory=HealthSettings)
    max_grad_norm: float = TrainConfig.max_grad_norm
    token_budget: int | None = (
        None  # the tokens a rollout is cut at: max_tokens (an episode's: max_episode_tokens)
    )
    lr: float | None = None
    accuracy_reward: str | None = (
        None  # the task's accuracy reward (accuracy_collapse reads reward/<it>/mean)
    )

    @classmethod
    def from_config(cls, config, budget: int | None = None, accuracy: str | None = None) -> "Thresholds":
        return cls(
            config.health, config.max_grad_norm, budget or config.sampling.max_tokens, config.lr, accuracy
        )


@dataclass
class History:
    """The metrics seen so far (oldest first) and the thresholds; what every rule reads."""

    steps: list[dict]
    t: Thresholds

    def values(self, key: str, last: int | None = None) -> list[float]:
        """The finite numbers logged under `key` in the last `last` steps (all steps if None)."""
        rows = self.steps if last is None else self.steps[-last:]
        return [float(r[key]) for r in rows if _number(r.get(key))]

    def last_measured(self, key: str, n: int) -> list[tuple[int, float]]:
        """(step, value) of the last n steps that logged a number under `key`, oldest first."""
        return [(r.get("step"), float(r[key])) for r in self.steps if _number(r.get(key))][-n:]

    def latest(self, key: str):
        value = self.steps[-1].get(key) if self.steps else None
        return float(value) if _number(value) else None

    @property
    def step(self):
        return self.steps[-1].get("step") if self.steps else None


@dataclass(frozen=True)
class Rule:
    name: str
    title: str  # what it means, in a few words
    check: Callable[[History], str | None]  # evidence when it fires
    suggestion: str  # what to do about it
    setting: str  # the TrainConfig field(s) that tune it
    seed: str  # the write-up evidence that motivated it (docs/health.md has more)


RULES: tuple[Rule, ...] = (
    Rule(
        "grad_at_clip",
        "gradient norm pinned at the clip limit",
        grad_at_clip,
        "the clip, not the gradient, now sets every update: if the norm is steady raise max_grad_norm "
        "(1.5-2.0), if it keeps growing lower lr",
        "health_clip_frac",
        "seed 001: 'grad=0.99-1.00 (consistently at clip limit)' is a warning sign; raise max_grad_norm to "
        "1.5-2.0",
    ),
    Rule(
        "grad_spike",
        "gradient-norm spike",
        grad_spike,
        "keep clipping on (max_grad_norm); lower lr; read this step's completions in completions.jsonl; with "
        "num_iterations > 1 a smaller epsilon_high bounds the ratio",
        "health_spike_factor",
        "seed 001: grad 111 at epoch 0.17, then 54,648,652 at 0.18 without clipping; the run was destroyed",
    ),
    Rule(
        "zero_std",
        "most groups carry no signal (zero reward std)",
        zero_std,
        "raise temperature (e.g. 0.8-1.0) or group_size so completions of a prompt differ; if the groups all "
        "succeed, the prompts are too easy: use harder data",
        "health_zero_std",
        "seed 001: hard-cap era frac_zero_std 0.50-1.00 with grad 0.0000: no learning; temperature 0.7 -> "
        "0.8",
    ),
    Rule(
        "reward_collapse",
        "reward collapse: no learning signal",
        reward_collapse,
        "if every completion gets the same reward, the reward cannot rank them: check the reward functions "
        "on completions.jsonl (a cap or saturated score?), prefer a multiplicative penalty to a cap, raise "
        "temperature; if the task is solved, stop or use harder prompts",
        "health_window",
        "seed 001: a hard reward cap gave 'loss=0.0000 grad=0.0000 (reward collapse)'; a x0.3 penalty fixed "
        "it",
    ),
    Rule(
        "reward_down",
        "reward trending down",
        reward_down,
        "lower lr and temperature; read completions.jsonl for reward hacking or runaway text; resume from an "
        "earlier checkpoint if it keeps falling",
        "health_reward_drop",
        "seed 001: 'reward decreasing over time' is a danger sign: lower temperature, reduce LR",
    ),
    Rule(
        "loss_spike",
        "loss spike",
        loss_spike,
        "lower lr or lengthen warmup; check grad_norm and KL for a matching jump",
        "health_loss_spike",
        "seed 003: mean loss 0.46 -> 0.82 (+78%) and 0.55 -> 0.74 between epochs while reward stalled",
    ),
    Rule(
        "kl_runaway",
        "KL to the reference running away",
        kl_runaway,
        "the policy is drifting far from the base model: lower lr, or set/raise beta to hold it near the "
        "reference (the base: on a continued start beta also pulls it back past where it started); look for "
        "runaway text in completions.jsonl",
        "health_kl_max",
        "seed 003: kl_penalty 0.1 too low, 'allowing model to drift'; README: lr 5e-4 gave KL > 5 in 20 "
        "steps",
    ),
    Rule(
        "entropy_collapse",
        "entropy collapse",
        entropy_collapse,
        "the policy is close to deterministic, so groups will stop disagreeing: raise temperature, lower lr, "
        "or set beta > 0",
        "health_entropy_drop",
        "seed 001: healthy entropy stayed 0.15-0.25; temperature was raised to prevent mode collapse",
    ),
    Rule(
        "truncated",
        "completions mostly truncated",
        truncated,
        "raise max_tokens if answers need the room; if the text runs on without ending, penalise runaway "
        "completions multiplicatively (x0.3) rather than capping the reward, and lower lr",
        "health_truncated_frac",
        "seed 001: 'filibuster' completions hit the length limit without the end marker",
    ),
    Rule(
        "advantage_blowup",
        "advantages far above the reward range (std scaling)",
        advantage_blowup,
        "dividing by a small group std amplifies reward noise: use scale_rewards none (the default) or a "
        "larger scale_eps",
        "health_adv_factor",
        "seed 004: std 0.04 for rewards [0.62, 0.68, 0.71, 0.65] amplifies advantages 25x; keep max < 10x "
        "range",
    ),
    Rule(
        "lr_too_low",
        "learning rate too low for the update size",
        lr_too_low,
        "AdamW moves each weight by about lr per step whatever the gradient: raise lr (3-10x)",
        "health_min_update",
        "seed 000: lr 1e-6 made updates tiny; back at 1e-5 the run reached 70% accuracy; seed 002 stalled at "
        "5e-7",
    ),
    Rule(
        "judge_unreadable",
        "the judge's answers are often not a score",
        judge_unreadable,
        "an unreadable answer gives that completion no judge reward: make the rubric ask for exactly "
        "'Score: N' on one line, or use a larger instruct model as judge",
        "health_judge_unreadable",
        "seed 003: an AI-feedback reward with high variance, 'reward signal noise' named as a root cause",
    ),
) + tuple(Rule(*rule) for rule in REWARD_RULES + TOOL_RULES)  # health_rewards.py, health_tools.py


@dataclass
class HealthMonitor:
    """Feeds each step's metrics through the rules; keeps which rules are firing.

    observe() returns the new events (dicts, as written to health.jsonl). A
    rule that keeps firing is reported once; it can be reported again after a
    whole window without firing. Every step with a skipped (non-finite) update
    is an event of its own, and `max_nonfinite` of them in a row set
    `stop_reason`.
    """

    thresholds: Thresholds = field(default_factory=Thresholds)
    rules: tuple[Rule, ...] = RULES
    max_nonfinite: int = 3
    steps: list[dict] = field(default_factory=list)
    quiet: dict[str, int] = field(default_factory=dict)  # firing rule -> steps since it last fired
    nonfinite_streak: int = 0
    stop_reason: str | None = None

    @classmethod
    def from_config(cls, config, resumed_from: Path | None = None, budget: int | None = None, accuracy=None):
        """The monitor of a run (accuracy: its task's accuracy reward's name); resuming, caught up on
        metrics.jsonl."""
        monitor = cls(
            Thresholds.from_config(config, budget, accuracy), max_nonfinite=config.max_nonfinite_steps
        )
        monitor.replay(
            read_run_records(Path(resumed_from) / "metrics.jsonl") if resumed_from is not None else []
        )
        return monitor

    def observe(self, metrics: dict) -> list[dict]:
        self.steps.append(metrics)
        history = History(self.steps, self.thresholds)
        events = []
        for rule in self.rules:
            evidence = rule.check(history)
            if evidence is None:
                if rule.name in self.quiet:
                    self.quiet[rule.name] += 1
                    if self.quiet[rule.name] >= self.thresholds.health.window:
                        del self.quiet[rule.name]  # re-armed
                continue
            if rule.name not in self.quiet:
                events.append(self._event(rule.name, rule.title, evidence, rule.suggestion))
            self.quiet[rule.name] = 0
        events += self._nonfinite(metrics)
        return events

    def _nonfinite(self, metrics: dict) -> list[dict]:
        skipped = metrics.get("update/nonfinite") or 0  # not a skip for want of signal (update/step.py)
        if not skipped:
            self.nonfinite_streak = 0
            return []
        self.nonfinite_streak += 1
        events = [
            self._event(
                "nonfinite",
                "non-finite loss or gradient: update skipped",
                f"{skipped} update(s) at step {metrics.get('step')} had a NaN/Inf loss or gradient "
                f"and were skipped, weights untouched ({self.nonfinite_streak} step(s) in a row; "
                f"the run stops at {self.max_nonfinite})",
                "lower lr; check the reward functions and completions.jsonl around this step",
            )
        ]
        if self.max_nonfinite and self.nonfinite_streak >= self.max_nonfinite:
            self.stop_reason = (
                f"stopped at step {metrics.get('step')}: the loss or gradient was NaN/Inf on "
                f"{self.nonfinite_streak} steps in a row (updates skipped, weights untouched)"
            )
        return events

    def _event(self, rule: str, title: str, evidence: str, suggestion: str) -> dict:
        return {
            "step": self.steps[-1].get("step"),
            "rule": rule,
            "title": title,
            "evidence": evidence,
            "suggestion": suggestion,
        }

    def replay(self, metrics_rows: list[dict]) -> None:
        """Catch up on the steps of a resumed run, reporting nothing (those events are on file)."""
        for row in training_rows(metrics_rows):
            self.observe(row)
        self.stop_reason = None  # the streak goes on, but only new steps can stop the run


class TrainingStopped(RuntimeError):
    """The run stopped itself (too many non-finite steps); the message is one line for the user."""


def stop_run(run_dir: Path, reason: str) -> str:
    """Record why a run stopped in summary.json; the line to show, naming the checkpoint to resume from."""
    from . import checkpoint as ckpt

    last = ckpt.latest_checkpoint(run_dir)
    where = (
        f"the last good checkpoint is {last} (resume with --resume {run_dir})"
        if last is not None
        else "no checkpoint had been written yet"
    )
    line = f"{reason}; {where}"
    ckpt.atomic_write_json(Path(run_dir) / "summary.json", {"stopped": True, "line": line})
    return line


def read_events(run_dir: str | Path) -> list[dict]:
    """The health events a run recorded in RUN_DIR/health.jsonl."""
    return read_run_records(Path(run_dir) / "health.jsonl")
