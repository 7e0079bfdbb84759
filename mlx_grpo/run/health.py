"""Training health: rules that read the recent step metrics and say what is going wrong.

Each rule looks at the metrics of the last steps (a window of `health_window`
steps, or a longer history where it needs one) and returns a line of evidence
when it fires. The monitor reports a rule once when it starts firing, and again
only after it has been quiet for a whole window. Every rule carries the seed
write-up that motivated it; docs/health.md explains each one.

Metric keys are the trainer's (see trainer.train_step); a missing or None value
is simply not evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..config import TrainConfig
from ..files import read_run_records, training_rows
from ..setting_groups import HealthSettings
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


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fitted_trend(values: list[float]) -> tuple[float, float]:
    """Least-squares slope per step and its t-statistic (inf when the fit is exact)."""
    y = np.asarray(values, dtype=np.float64)
    x = np.arange(len(y), dtype=np.float64)
    x -= x.mean()
    slope = float((x * (y - y.mean())).sum() / (x * x).sum())
    residual = y - y.mean() - slope * x
    se = math.sqrt((residual**2).sum() / max(len(y) - 2, 1) / (x * x).sum())
    t = slope / se if se > 0 else math.copysign(math.inf, slope) if slope else 0.0
    return slope, t


# ---- the rules: each returns a line of evidence when it fires, else None ----


def grad_at_clip(h: History) -> str | None:
    norms = h.values("grad_norm", h.t.health.window)
    if len(norms) < h.t.health.window:
        return None
    limit = h.t.max_grad_norm
    at = sum(n >= 0.99 * limit for n in norms)
    if at / len(norms) <= h.t.health.clip_frac:
        return None
    return (
        f"grad norm at or above the clip limit ({limit:g}) on {at} of the last {len(norms)} steps "
        f"(median {np.median(norms):.3g})"
    )


def grad_spike(h: History) -> str | None:
    now = h.latest("grad_norm")
    rows = h.steps[-2 * h.t.health.window - 1 : -1]  # the two windows before this step
    before = [float(r["grad_norm"]) for r in rows if _number(r.get("grad_norm")) and r["grad_norm"] > 0]
    if now is None or len(before) < h.t.health.window:
        return None
    median = float(np.median(before))
    if now <= h.t.health.spike_factor * median:
        return None
    return (
        f"grad norm {_big(now)} at step {h.step} is {_big(now / median)}x its running median "
        f"{median:.3g} (last {len(before)} steps)"
    )


def _big(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:.3g}"


def zero_std(h: History) -> str | None:
    fracs = h.values("frac_zero_std", h.t.health.window)
    if len(fracs) < h.t.health.window or np.mean(fracs) <= h.t.health.zero_std:
        return None
    reward = h.values("reward/mean", h.t.health.window)
    at = f" (reward/mean {np.mean(reward):.3g})" if reward else ""
    return (
        f"{np.mean(fracs):.0%} of groups had identical rewards over the last {len(fracs)} steps{at}: "
        f"those groups give no gradient"
    )


def _silent(row: dict) -> bool:
    """A step that learned nothing: loss 0 and grad 0, or every reward equal."""
    loss, grad, std, fzs = (row.get(k) for k in ("loss", "grad_norm", "reward/std", "frac_zero_std"))
    no_update = _number(loss) and _number(grad) and abs(loss) <= 1e-8 and grad <= 1e-8
    all_equal = (_number(std) and std <= 1e-8) or (_number(fzs) and fzs >= 1.0)
    return no_update or all_equal


def reward_collapse(h: History) -> str | None:
    n = max(2, h.t.health.window // 2)
    rows = h.steps[-n:]
    if len(rows) < n or not all(_silent(r) for r in rows):
        return None
    reward = h.latest("reward/mean")
    best = max(h.values("reward/best_of_n") or [math.nan])
    level = "" if reward is None else f" (reward/mean {reward:.3g})"
    if all(
        _silent(r) for r in h.steps
    ):  # never a reward spread: nothing was ever learnt, so nothing is solved
        return (
            f"every completion in each group has scored alike since the run began{level}: the reward has "
            f"never told completions apart, so there has been no learning signal (too hard for the model, "
            f"or a reward that never fires?)"
        )
    if reward is not None and reward >= best - 1e-9:
        return (
            f"for the last {n} steps every completion in each group scored alike, at the best reward of "
            f"the run{level}: nothing left to learn from these prompts (solved?)"
        )
    return (
        f"for the last {n} steps every completion in each group scored alike{level}, "
        f"or loss and grad norm were 0: no learning signal"
    )


def reward_down(h: History) -> str | None:
    n = 2 * h.t.health.window
    rewards = h.values("reward/mean", n)
    spread = h.values("reward/std", n)
    if len(rewards) < n or not spread or np.mean(spread) <= 0:
        return None
    slope, t = fitted_trend(rewards)
    drop = -slope * (n - 1)
    if t > -3 or drop <= h.t.health.reward_drop * float(np.mean(spread)):
        return None
    return (
        f"reward/mean fell by {drop:.3g} over the last {n} steps ({rewards[0]:.3g} -> {rewards[-1]:.3g}; "
        f"fitted slope {slope:.2g}/step, t={t:.1f}; within-batch std {np.mean(spread):.3g})"
    )


def loss_spike(h: History) -> str | None:
    w = h.t.health.window
    losses = h.values("loss", 2 * w)
    if len(losses) < 2 * w:
        return None
    before, now = abs(float(np.mean(losses[:w]))), abs(float(np.mean(losses[w:])))
    # The loss is a weighted mean of ratio x advantage: a change far below the
    # advantages' own size is noise (the GRPO loss is ~0 with one update per batch).
    floor = 0.1 * float(np.mean(h.values("advantage/abs_mean", 2 * w) or [0.0]))
    if now <= (1 + h.t.health.loss_spike) * before or now - before <= floor:
        return None
    grown = f"up {now / before - 1:.0%}" if before > 0 else "up from 0"
    return f"|mean loss| over the last {w} steps is {now:.3g}, {grown} from {before:.3g} over the {w} before"


def kl_runaway(h: History) -> str | None:
    # Judged from the run's first measured KL: 0 from the base, while a continued start (a warm start, a run
    # folder as the model) begins as far from the base as the adapters it continues already put it.
    measured = h.last_measured("kl", len(h.steps))
    if len(measured) < 2 or measured[-1][1] <= measured[-2][1]:
        return None  # one value is no trend; high but no longer rising is not a runaway
    (first, start), (_, now) = measured[0], measured[-1]
    if now - start <= h.t.health.kl_max:
        return None
    trail = ", ".join(f"{kl:.3g} at step {s}" for s, kl in measured[-3:])
    since = (
        f", up {now - start:.3g} from the {start:.3g} it started at (step {first})" if round(start, 3) else ""
    )
    return f"KL to the reference is {now:.3g} and rising ({trail}){since}"


def entropy_collapse(h: History) -> str | None:
    w = h.t.health.window
    if len(h.steps) < 2 * w:
        return None
    first = [float(r["entropy"]) for r in h.steps[:w] if _number(r.get("entropy"))]
    recent = h.values("entropy", w)
    if len(first) < w // 2 or len(recent) < w // 2 or np.mean(first) <= 0:
        return None
    start, now = float(np.mean(first)), float(np.mean(recent))
    if now >= h.t.health.entropy_drop * start:
        return None
    return (
        f"token entropy {now:.3g} over the last {w} steps, {now / start:.0%} of its {start:.3g} "
        f"over the first {w}"
    )


def truncated(h: History) -> str | None:
    fracs = h.values("completion/truncated_frac", h.t.health.window)
    if len(fracs) < h.t.health.window or np.mean(fracs) <= h.t.health.truncated_frac:
        return None
    limit = f" ({h.t.token_budget} tokens)" if h.t.token_budget else ""
    lengths = h.values("completion/mean_length", h.t.health.window)
    mean_len = f", mean length {np.mean(lengths):.1f}" if lengths else ""
    return (
        f"{np.mean(fracs):.0%} of completions were cut at the token budget{limit} over the last {len(fracs)} steps"
        f"{mean_len}"
    )


def advantage_blowup(h: History) -> str | None:
    low, high = h.latest("advantage/min"), h.latest("advantage/max")
    r_low, r_high = h.latest("reward/min"), h.latest("reward/max")
    if None in (low, high, r_low, r_high) or r_high - r_low <= 0:
        return None
    biggest, span = max(abs(low), abs(high)), r_high - r_low
    if biggest <= h.t.health.adv_factor * span:
        return None
    return (
        f"advantages reach {biggest:.3g} at step {h.step} while rewards span only {span:.3g} "
        f"({biggest / span:.0f}x)"
    )


def lr_too_low(h: History) -> str | None:
    w = h.t.health.window
    # Only steps at full learning rate: warmup and the end of the decay are meant to move little. Steps
    # with no gradient (every group alike) move nothing at any lr: reward_collapse and zero_std say why.
    rows = [
        r
        for r in h.steps[-w:]
        if (h.t.lr is None or (_number(r.get("lr")) and r["lr"] >= 0.5 * h.t.lr)) and not _silent(r)
    ]
    sizes = [float(r["update/rel_change"]) for r in rows if _number(r.get("update/rel_change"))]
    if len(sizes) < w or np.median(sizes) >= h.t.health.min_update:
        return None
    rewards = h.values("reward/mean", w)
    if len(rewards) >= 3 and fitted_trend(rewards)[1] >= 2:
        return None  # small steps, but the reward is climbing: leave it be
    lr = h.latest("lr")
    at = f" at lr {lr:.2g}" if lr is not None else ""
    return (
        f"each update moved the weights by {np.median(sizes):.2g} of their norm (median of the last {w} "
        f"steps){at}, and reward/mean is not rising"
    )


def judge_unreadable(h: History) -> str | None:
    fracs = h.values("judge/unreadable_frac", h.t.health.window)
    if len(fracs) < 2 or np.mean(fracs) <= h.t.health.judge_unreadable:
        return None  # two steps suffice to warn early: the judge itself does not change during a run
    example = h.steps[-1].get("judge/unreadable_example")
    said = f"; it said {example[:80]!r}" if isinstance(example, str) else ""
    return (
        f"{np.mean(fracs):.0%} of the judge's answers over the last {len(fracs)} steps were not a score{said}"
    )


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
        "seed 001: 'grad=0.99-1.00 (consistently at clip limit)' is a warning sign; raise max_grad_norm to 1.5-2.0",
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
        "seed 001: hard-cap era frac_zero_std 0.50-1.00 with grad 0.0000: no learning; temperature 0.7 -> 0.8",
    ),
    Rule(
        "reward_collapse",
        "reward collapse: no learning signal",
        reward_collapse,
        "if every completion gets the same reward, the reward cannot rank them: check the reward functions "
        "on completions.jsonl (a cap or saturated score?), prefer a multiplicative penalty to a cap, raise "
        "temperature; if the task is solved, stop or use harder prompts",
        "health_window",
        "seed 001: a hard reward cap gave 'loss=0.0000 grad=0.0000 (reward collapse)'; a x0.3 penalty fixed it",
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
        "seed 003: kl_penalty 0.1 too low, 'allowing model to drift'; README: lr 5e-4 gave KL > 5 in 20 steps",
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
        "seed 004: std 0.04 for rewards [0.62, 0.68, 0.71, 0.65] amplifies advantages 25x; keep max < 10x range",
    ),
    Rule(
        "lr_too_low",
        "learning rate too low for the update size",
        lr_too_low,
        "AdamW moves each weight by about lr per step whatever the gradient: raise lr (3-10x)",
        "health_min_update",
        "seed 000: lr 1e-6 made updates tiny; back at 1e-5 the run reached 70% accuracy; seed 002 stalled at 5e-7",
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
        """The monitor of a run (accuracy: its task's accuracy reward's name); resuming, caught up on metrics.jsonl."""
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
