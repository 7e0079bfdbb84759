"""What a step writes down once its update is done: its metrics (metrics.jsonl, the live table,
the health rules) and its completion records (completions.jsonl).

The update's own numbers (loss, gradient norm, clipping, KL, entropy) come from update/step.py;
the rest is worked out here from the step's rollouts (step_rollouts.StepRollouts) and what was
trained (step_update.Trained), so the metrics and the records sit beside the step that makes them.
"""

from __future__ import annotations

import math
import time

import mlx.core as mx
import numpy as np

from ..config import TrainConfig
from ..sampling.kinds import rollouts_for
from ..tasks.registry import Task
from ..tasks.rewarding import part_means, reward_metrics
from ..update.advantages import advantage_stats, zero_std_frac
from .guidance import guided_metrics
from .health_rewards import answer_pattern, reward_variance_shares
from .step_rollouts import StepRollouts
from .step_update import Trained


def step_metrics(
    task: Task,
    config: TrainConfig,
    sampled: StepRollouts,
    trained: Trained,
    prompt_tokens: int,
    update_s: float,
    start: float,
) -> dict:
    """The step's rewards, advantages, filters, lengths, speeds, time and memory (the step began at
    `start`)."""
    g = config.group_size
    grouped = sampled.rewards.reshape(-1, g)
    lengths = np.array(
        [c.model_tokens for c in sampled.completions]
    )  # the model's own tokens, not observations
    truncated = np.array([c.truncated for c in sampled.completions])
    trained_tokens = sum(len(c.tokens) for c in trained.completions)
    metrics = {
        "reward/mean": float(sampled.rewards.mean()),
        "reward/std": float(sampled.rewards.std()),
        "reward/best_of_n": float(grouped.max(axis=1).mean()),
        "reward/raw_mean": float(sampled.raw_rewards.mean()),
        **{f"reward/{name}/mean": value for name, value in part_means(sampled.parts).items()},
        **{f"reward/{name}/errors": n for name, n in sampled.errors.items()},
        **(advantage_stats(trained.advantages) if trained.completions else {}),  # over the groups trained on
        "frac_zero_std": zero_std_frac(sampled.rewards, g),  # over every sampled group
        "filter/dropped_frac": float(1 - sampled.keep.mean()),
        "filter/rounds": sampled.rounds,
        "completion/mean_length": float(lengths.mean()),
        **answer_pattern([c.text for c in sampled.completions]),
        **reward_variance_shares(sampled.parts, task.reward_weights, g, config.shaping),
        "completion/truncated_frac": float(truncated.mean()),
        "tokens_per_s": int(lengths.sum()) / max(sampled.seconds, 1e-9),
        "train/tokens_per_s": (prompt_tokens + trained_tokens)
        * config.objective.num_iterations
        / max(update_s, 1e-9),
        "time/rollout_s": sampled.seconds,
        "time/update_s": update_s,
        **reward_metrics(task.reward_functions),  # a judge's time/judge_s and judge/unreadable_frac
        "time/step_s": time.perf_counter() - start,
        "memory/peak_gb": mx.get_peak_memory() / 1e9,
    }
    metrics.update(
        rollouts_for(task).step_metrics(sampled.completions)
    )  # a multi-turn task's episode metrics
    if task.curriculum:
        metrics.update(task.curriculum.metrics(task.train_rows))
    if config.guide:
        metrics.update(guided_metrics(task, sampled.completions, sampled.parts, g))
    for name, example in sampled.error_examples.items():
        metrics[f"reward/{name}/error_example"] = example
    return metrics


def completion_records(
    tokenizer, task: Task, step: int, sampled: StepRollouts, trained: Trained
) -> list[dict]:
    """One completions.jsonl record a sampled completion (or episode): its prompt, text, rewards and
    advantage (None: its group was filtered out and not trained on)."""
    rollouts = rollouts_for(task)
    advantage_of = trained.advantage_of()
    records = []
    for i, c in enumerate(sampled.completions):
        records.append(
            {
                "step": step,
                "prompt": sampled.rows[c.prompt_index]["prompt"],
                "completion": c.text,
                "reward": float(sampled.rewards[i]),
                "raw_reward": float(sampled.raw_rewards[i]),
                "rewards": {name: values[i] for name, values in sampled.parts.items()},
                "advantage": float(advantage_of[i]) if i in advantage_of else None,
                "finish_reason": c.finish_reason,
                "length": c.model_tokens,
                **({"guided": True} if getattr(c, "guided", False) else {}),
                **rollouts.record(
                    tokenizer, c
                ),  # an episode's turns as trained and masked text, its tool calls
            }
        )
    return records


def reward_range(records: list[dict]) -> dict:
    """reward/min and reward/max of one step's completion records (advantage_blowup compares to them)."""
    rewards = [r["reward"] for r in records if _finite(r.get("reward"))]
    return {"reward/min": min(rewards), "reward/max": max(rewards)} if rewards else {}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
