"""Accuracy on held-out prompts: one batched greedy decode, then the task's check.

The trainer's before/after check and `eval` both use it, so it sits below run/ and evaluation/."""

from __future__ import annotations

import time

import numpy as np

from ..stats import mean_pass_at_k
from ..tasks.accuracy import accuracy_of, accuracy_values, right
from ..tasks.data import task_prompts
from .rollout import SamplingConfig, sample_completions


def _answers_and_scores(model, tokenizer, task, k: int, sampling: SamplingConfig, concurrency: int):
    """k completions per held-out row (one batched decode) and the accuracy of each (tasks/accuracy.py)."""
    rows = task.eval_rows
    was_training = model.training
    model.eval()
    prompts = task_prompts(tokenizer, task, rows)
    completions = sample_completions(model, tokenizer, prompts, k, sampling, concurrency)
    values = accuracy_of(accuracy_values(task, rows, k, completions))
    model.train(was_training)
    return completions, values


def evaluate_accuracy(model, tokenizer, task, max_tokens: int, concurrency: int = 256,
                      temperature: float = 0.0) -> dict:
    """The share of the held-out rows answered right (tasks/accuracy.py's `right`; greedy by default)."""
    if not task.eval_rows or task.accuracy_reward is None:
        return {"accuracy": None, "n": 0}
    start = time.perf_counter()
    completions, values = _answers_and_scores(
        model, tokenizer, task, 1, SamplingConfig(temperature=temperature, max_tokens=max_tokens), concurrency)
    return {
        "accuracy": float(right(values).mean()),
        "n": len(task.eval_rows),
        "mean_length": float(np.mean([len(c.tokens) for c in completions])),
        "truncated_frac": float(np.mean([c.truncated for c in completions])),
        "seconds": time.perf_counter() - start,
        "completions": [c.text for c in completions],
    }


def evaluate_pass_at_k(model, tokenizer, task, k: int, max_tokens: int, temperature: float,
                       concurrency: int = 256, seed: int = 0) -> float | None:
    """Sampled pass@k on the held-out rows: k completions each, the unbiased estimator (n = k).

    Seeded on its own, so evaluating does not depend on (or disturb) where training is.
    """
    if not task.eval_rows or task.accuracy_reward is None:
        return None
    import mlx.core as mx

    mx.random.seed(seed)
    _, values = _answers_and_scores(
        model, tokenizer, task, k, SamplingConfig(temperature=temperature, max_tokens=max_tokens), concurrency)
    successes = right(values).reshape(len(task.eval_rows), k).sum(axis=1)
    return mean_pass_at_k(successes, k, k)
