"""`mlx-grpo inspect RUN_DIR --first-tokens N`: the first tokens of an answer, before and after training.

A format collapse (every answer a bare "#### N", a code fence dropped) starts at
the answer's first token. For each of the first N held-out prompts of the run's
task, this lists the most likely first tokens (probabilities at temperature 1)
of the base model and of the trained one. The base is loaded on its own, not
the trained model with its adapters switched off, so a full fine-tune is read
the same way as LoRA.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from ..sampling.kinds import rollouts_for
from ..tasks.data import task_prompts
from ..run.task_setup import load_task
from .compare import CompareError, ModelSpec, load_model, resolve_model, task_config

TOP = 5  # tokens listed per prompt and model


@dataclass
class FirstTokens:
    prompt: str
    base: list[tuple[str, float]]  # (token text, probability), most likely first
    trained: list[tuple[str, float]]


def first_token_probs(model, prompt_tokens: list[int]) -> mx.array:
    """The model's next-token distribution after the prompt, at temperature 1."""
    logits = model(mx.array([prompt_tokens]))[0, -1].astype(mx.float32)
    return mx.softmax(logits, axis=-1)


def top_tokens(tokenizer, probs: mx.array, k: int = TOP) -> list[tuple[str, float]]:
    order = mx.argsort(-probs)[:k].tolist()
    return [(tokenizer.decode([t]), probs[t].item()) for t in order]


def first_tokens(run_dir: str | Path, n: int, k: int = TOP) -> list[FirstTokens]:
    """The first n held-out prompts of the run's task, each with base and trained top-k first tokens."""
    if n < 1:
        raise CompareError(f"--first-tokens must be at least 1, got {n}")
    trained = resolve_model(str(run_dir))
    if trained.run_dir is None or trained.adapter is None:
        raise CompareError(f"{run_dir}: not a run folder (config.yaml and adapters)")
    config = task_config(
        trained.run_dir, trained.model, {}
    )  # the run's own held-out rows, the first n of them
    task = load_task(config)
    if rollouts_for(task).plays_episodes:
        raise CompareError(
            f"task {task.name!r} plays multi-turn episodes: its first prompt is an environment's, "
            "so --first-tokens does not apply"
        )
    rows = task.eval_rows[:n]
    if not rows:
        raise CompareError(f"task {task.name!r} has no held-out prompts")
    model, tokenizer = load_model(ModelSpec(trained.model), config.keep_quantized)
    prompts = task_prompts(tokenizer, task, rows)  # adapters leave the tokenizer as it is
    base = [top_tokens(tokenizer, first_token_probs(model, p), k) for p in prompts]
    del model
    mx.clear_cache()  # the trained model gets the memory
    model, tokenizer = load_model(trained, config.keep_quantized)
    after = [top_tokens(tokenizer, first_token_probs(model, p), k) for p in prompts]
    return [FirstTokens(str(row["prompt"]), b, a) for row, b, a in zip(rows, base, after)]


def first_token_lines(found: list[FirstTokens]) -> list[str]:
    lines = [
        f"first tokens of the answer (temperature 1), base and trained, on {len(found)} held-out prompts"
    ]
    for item in found:
        lines.append(f"  {item.prompt[:70]!r}")
        for name, tops in (("base", item.base), ("trained", item.trained)):
            lines.append(f"    {name:<8}" + "  ".join(f"{text!r} {p:.3f}" for text, p in tops))
    return lines
