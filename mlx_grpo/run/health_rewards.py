"""Health rules that read what the rewards did inside the groups (health.py registers them).

Where right answers are rare, most groups have no right answer: the first
(main) reward is the same for every completion of the group, and whatever
else differs, a 0.1-weight format reward say, sets every advantage. The
SmolLM2 GSM8K recipe learned exactly that: format 0.02 -> 0.97, accuracy
0.015 -> 0.010, answers shrunk to "#### 3". Three rules see it:

- reward_takeover: a side reward carries most of the within-group reward
  variance, or the main reward is flat in most groups while the total is not.
- answer_collapse: completions shrink fast while the main reward does not
  rise, or one short answer makes up most completions.
- accuracy_collapse: the task's own accuracy reward (logged as a part, at
  weight 0 where it is not paid) falls to a quarter of its first steps while
  training goes on: Qwen2.5-Coder-0.5B on OCaml learned partial credit for
  trivial programs, 15/32 passing at step 1 and none from step 7, with no
  other rule firing (the hack sat inside one reward part).

The step metrics they read come from `reward_variance_shares` and
`answer_pattern`, which the trainer logs every step.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..tasks.shaping import side_shaped_parts

SHARE_PREFIX = "reward_share/"


def reward_variance_shares(
    parts: dict[str, list], weights: list[float], group_size: int, shaping: str = "always"
) -> dict:
    """Each reward's share of the within-group variance of the weighted rewards, and the share of
    groups where the main (first) reward is flat but the total is not. Empty with one reward.

    Measured on what is trained on: the side rewards as `shaping` counts them, so a
    run that took the fix (--shaping gated) is not warned about the takeover it prevented."""
    names = list(parts)
    # No completions (a step whose every episode was cut before any reward, say): nothing to share.
    if len(names) < 2 or group_size < 2 or not parts[names[0]] or len(parts[names[0]]) % group_size:
        return {}
    # An environment that totals its own parts (web) gives no weights: how much each part
    # moves the reward is unknown, so no share is claimed.
    if len(weights) != len(names):
        return {}
    grouped = side_shaped_parts(parts, weights, group_size, shaping).reshape(len(names), -1, group_size)
    variance = grouped.var(axis=2).sum(axis=1)
    metrics = {}
    if variance.sum() > 0:
        metrics.update(
            {f"{SHARE_PREFIX}{name}": float(v / variance.sum()) for name, v in zip(names, variance)}
        )
    main_flat = grouped[0].std(axis=1) < 1e-9
    total_varies = grouped.sum(axis=0).std(axis=1) > 1e-9
    metrics["groups/main_flat_frac"] = float(np.mean(main_flat & total_varies))
    return metrics


def answer_pattern(texts: list[str]) -> dict:
    """The most common completion of a step (whitespace folded) and the share of completions it is."""
    if not texts:
        return {}
    answer, count = Counter(" ".join(t.split()) for t in texts).most_common(1)[0]
    return {"completion/top_share": count / len(texts), "completion/top_answer": answer[:80]}


def _shares(h) -> dict[str, float]:
    """Mean share of each reward over the last window, the main (first logged) reward first."""
    rows = [r for r in h.steps[-h.t.health.window :] if any(k.startswith(SHARE_PREFIX) for k in r)]
    if len(rows) < max(3, h.t.health.window // 2):
        return {}
    names = [k[len(SHARE_PREFIX) :] for k in rows[-1] if k.startswith(SHARE_PREFIX)]
    return {name: float(np.mean([r.get(SHARE_PREFIX + name) or 0.0 for r in rows])) for name in names}


def reward_takeover(h) -> str | None:
    shares = _shares(h)
    window = h.t.health.window
    main, side = "the main reward", "the side rewards"
    if shares:
        main, *sides = shares
        side = max(sides, key=shares.get)
        if shares[side] > h.t.health.takeover_share:
            return (
                f"the side reward {side} carries {shares[side]:.0%} of the within-group reward variance over "
                f"the last {window} steps (the main reward {main}: {shares[main]:.0%}): it, not {main}, "
                "sets the advantages"
            )
    flat = h.values("groups/main_flat_frac", window)
    if len(flat) >= max(3, window // 2) and np.mean(flat) > h.t.health.takeover_share:
        return (
            f"in {np.mean(flat):.0%} of groups over the last {len(flat)} steps {main} was the same for every "
            f"completion while the total still differed: those groups were trained on {side} alone"
        )
    return None


def answer_collapse(h) -> str | None:
    window = h.t.health.window
    example = next(
        (r["completion/top_answer"] for r in reversed(h.steps) if r.get("completion/top_answer")), ""
    )
    shares = h.values("completion/top_share", window)
    if len(shares) >= window and np.mean(shares) > h.t.health.collapse_share and len(example) <= 20:
        return (
            f"one short answer makes up {np.mean(shares):.0%} of the completions over the last {window} "
            "steps, "
            f"e.g. {example!r}"
        )
    lengths = h.values("completion/mean_length")
    if len(lengths) < 2 * window:
        return None
    early, recent = float(np.mean(lengths[:window])), float(np.mean(lengths[-window:]))
    main = next(iter(_shares(h)), None)
    key = f"reward/{main}/mean" if main else "reward/mean"
    rewards = h.values(key)
    if recent < h.t.health.collapse_share * early and (
        not rewards or np.mean(rewards[-window:]) <= np.mean(rewards[:window]) + 0.02
    ):
        return (
            f"completions shrank from {early:.0f} to {recent:.0f} tokens while {key} did not rise "
            f"(latest most common answer: {example!r})"
        )
    return None


ACCURACY_STEPS = 4  # accuracy_collapse compares the run's first this many steps with its last as many
ACCURACY_FLOOR = 0.1  # ... when at least this share was right at first (below it there is nothing to lose)
ACCURACY_FALL = 0.25  # ... and fires when the recent share is at most this fraction of the first


def accuracy_collapse(h) -> str | None:
    if not h.t.accuracy_reward:
        return None
    key, k = f"reward/{h.t.accuracy_reward}/mean", ACCURACY_STEPS
    rows = [r for r in h.steps if isinstance(r.get(key), (int, float)) and np.isfinite(r[key])]
    if len(rows) < 2 * k:  # the two windows must not overlap
        return None
    early, recent = float(np.mean([r[key] for r in rows[:k]])), float(np.mean([r[key] for r in rows[-k:]]))
    if early < ACCURACY_FLOOR or recent > ACCURACY_FALL * early:
        return None
    steps = [f"steps {rs[0].get('step')}-{rs[-1].get('step')}" for rs in (rows[:k], rows[-k:])]
    rewards = [
        [r["reward/mean"] for r in rs if isinstance(r.get("reward/mean"), (int, float))]
        for rs in (rows[:k], rows[-k:])
    ]
    reward = (
        f" while the mean reward went {np.mean(rewards[0]):.2f} -> {np.mean(rewards[1]):.2f}"
        if all(rewards)
        else ""
    )
    return (
        f"the share of right answers in training ({key}) fell from {early:.2f} ({steps[0]}) to {recent:.2f} "
        f"({steps[1]}){reward}: the reward may be paying for something other than the task (a hack)"
    )


# Registered by health.py (a Rule each: name, title, check, suggestion, setting, seed evidence).
REWARD_RULES = (
    (
        "reward_takeover",
        "a side reward took over the advantages",
        reward_takeover,
        "the main reward rarely varies inside a group, so a small side reward decides every update: use "
        "--shaping gated (side rewards count only where the main reward varies), zero or lower the side "
        "reward, "
        "raise group_size, or pick prompts the model sometimes solves (--curriculum ued, --prefilter K; "
        "docs/rare-rewards.md)",
        "health_takeover_share",
        "SmolLM2-135M on GSM8K: format reward (weight 0.1) 0.02 -> 0.97 while accuracy fell 0.015 -> 0.010",
    ),
    (
        "answer_collapse",
        "answers collapsed to a short pattern",
        answer_collapse,
        "the policy found a short answer that some reward likes: read completions.jsonl, drop or gate the "
        "reward "
        "that pays for it, and lower lr",
        "health_collapse_share",
        "SmolLM2-135M on GSM8K: 258 of 287 answers in steps 9-18 were a single digit; completions 201 -> 50 "
        "tokens",
    ),
    (
        "accuracy_collapse",
        "right answers collapsed during training",
        accuracy_collapse,
        "read completions.jsonl from the steps of the fall for what the reward now pays (partial credit for "
        "trivial "
        "answers, an echo of the input); pay only for the task's own success (weight its accuracy reward, "
        "zero the "
        "partial credit), lower lr, or resume from a checkpoint before the fall; see docs/health.md",
        "none (constants ACCURACY_STEPS, ACCURACY_FLOOR, ACCURACY_FALL in health_rewards.py)",
        "OCaml on Qwen2.5-Coder-0.5B: 15/32 programs passing at step 1, 0 from step 7, "
        "reward 0.51 -> 0.35, no rule fired",
    ),
)
