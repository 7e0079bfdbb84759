"""The health rules' checks on what every run logs: gradient norm, loss, rewards, KL, entropy, lengths,
advantages, update size and the judge's answers (health.py registers them as rules, with health_rewards.py's
and health_tools.py's).

Each reads a History (health.py): the metrics of the last steps and the thresholds, and returns a line of
evidence when it fires, else None. A missing or None value is simply not evidence.
"""

from __future__ import annotations

import math

import numpy as np


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


def grad_at_clip(h) -> str | None:
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


def grad_spike(h) -> str | None:
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


def zero_std(h) -> str | None:
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


def reward_collapse(h) -> str | None:
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


def reward_down(h) -> str | None:
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


def loss_spike(h) -> str | None:
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


def kl_runaway(h) -> str | None:
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


def entropy_collapse(h) -> str | None:
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


def truncated(h) -> str | None:
    fracs = h.values("completion/truncated_frac", h.t.health.window)
    if len(fracs) < h.t.health.window or np.mean(fracs) <= h.t.health.truncated_frac:
        return None
    limit = f" ({h.t.token_budget} tokens)" if h.t.token_budget else ""
    lengths = h.values("completion/mean_length", h.t.health.window)
    mean_len = f", mean length {np.mean(lengths):.1f}" if lengths else ""
    return (
        f"{np.mean(fracs):.0%} of completions were cut at the token budget{limit} over the last {len(fracs)} "
        "steps"
        f"{mean_len}"
    )


def advantage_blowup(h) -> str | None:
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


def lr_too_low(h) -> str | None:
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


def judge_unreadable(h) -> str | None:
    fracs = h.values("judge/unreadable_frac", h.t.health.window)
    if len(fracs) < 2 or np.mean(fracs) <= h.t.health.judge_unreadable:
        return None  # two steps suffice to warn early: the judge itself does not change during a run
    example = h.steps[-1].get("judge/unreadable_example")
    said = f"; it said {example[:80]!r}" if isinstance(example, str) else ""
    return (
        f"{np.mean(fracs):.0%} of the judge's answers over the last {len(fracs)} steps were not a score{said}"
    )
