"""Accuracy on held-out prompts: one batched greedy decode, then the task's check.

The trainer's before/after check and `eval` both use it, so it sits below run/ and evaluation/. Both
decode with a seed of their own: MLX's global random state is neither read nor moved, so evaluating
does not depend on, or disturb, where the caller's draws are."""

from __future__ import annotations

import time

import numpy as np

from ..stats import mean_pass_at_k
from ..tasks.accuracy import accuracy_of, accuracy_values, right
from ..tasks.data import task_prompts
from .rollout import SamplingConfig, sample_completions


def _answers_and_scores(
    model, tokenizer, task, k: int, sampling: SamplingConfig, concurrency: int, seed: int
):
    """k completions per held-out row (one batched decode, drawn with keys of (seed, row, member) alone) and
    the accuracy of each (tasks/accuracy.py)."""
    rows = task.eval_rows
    was_training = model.training
    model.eval()
    prompts = task_prompts(tokenizer, task, rows)
    completions = sample_completions(model, tokenizer, prompts, k, sampling, concurrency, seed=seed)
    values = accuracy_of(accuracy_values(task, rows, k, completions))
    model.train(was_training)
    return completions, values


def evaluate_accuracy(model, tokenizer, task, max_tokens: int, concurrency: int = 256) -> dict:
    """The share of the held-out rows answered right (tasks/accuracy.py's `right`), answered greedily."""
    if not task.eval_rows or task.accuracy_reward is None:
        return {"accuracy": None, "n": 0}
    start = time.perf_counter()
    # A greedy decode draws nothing; its seed only keeps sampling from drawing one from MLX's global state.
    completions, values = _answers_and_scores(
        model, tokenizer, task, 1, SamplingConfig(temperature=0.0, max_tokens=max_tokens), concurrency, seed=0
    )
    return {
        "accuracy": float(right(values).mean()),
        "n": len(task.eval_rows),
        "mean_length": float(np.mean([len(c.tokens) for c in completions])),
        "truncated_frac": float(np.mean([c.truncated for c in completions])),
        "seconds": time.perf_counter() - start,
        "completions": [c.text for c in completions],
    }


def evaluate_pass_at_k(
    model, tokenizer, task, k: int, max_tokens: int, temperature: float, concurrency: int = 256, seed: int = 0
) -> float | None:
    """Sampled pass@k on the held-out rows: k completions each, the unbiased estimator (n = k).

    Drawn with keys of (seed, row, member) alone: the same seed gives the same pass@k whatever MLX's global
    random state is, and leaves that state where it was.
    """
    if not task.eval_rows or task.accuracy_reward is None:
        return None
    _, values = _answers_and_scores(
        model,
        tokenizer,
        task,
        k,
        SamplingConfig(temperature=temperature, max_tokens=max_tokens),
        concurrency,
        seed,
    )
    successes = right(values).reshape(len(task.eval_rows), k).sum(axis=1)
    return mean_pass_at_k(successes, k, k)
