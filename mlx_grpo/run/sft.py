"""The supervised fine-tuning loop: demonstrations in, a masked cross-entropy step at a time.

One step takes the next `batch_size` demonstrations (each epoch a fresh order drawn from the
seed and the epoch's number alone, so a resumed run takes the same ones), pads each
micro-batch of `micro_batch_size` rows (fewer on a CPU when their activations would pass train's
budget, update/batch.py) to its longest, sums the micro-batches' gradients of
the loss normalised by the batch's trained tokens (update/sft_loss.py), clips their global
norm at `max_grad_norm` (the norm before clipping is logged) and steps AdamW on train's
warmup + cosine schedule. A step whose loss or gradient is not finite leaves the weights
alone, and `max_nonfinite_steps` of them in a row stop the run (run/health.py).

The run folder, resume, checkpoints, the time limit, health and the reporters are train's: its
run loop (loop.py) takes sft's steps (SFTTraining). The folder holds config.yaml, metrics.jsonl
(one row a step: loss, val_loss when measured, tokens_per_s, lr, grad_norm, grad_clipped),
health.jsonl, checkpoints/ with exact resume, the adapters, summary.json. The validation loss on
held-out demonstrations is measured before the first step, every `eval_steps` and at the end; a
built-in task's run also measures the held-out accuracy before (unless eval_before is false) and
after, as train does: over the rows train's check reads, each reward call bounded by
reward_timeout (setup.py's guard_task).
"""

from __future__ import annotations

import math
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map

from ..config import TrainConfig
from ..models.screen_info import context_length
from ..update.batch import memory_bound_size
from ..update.sft_loss import pad_rows, sft_gradients, sft_loss
from . import distributed as dist
from . import run_result, step_update
from .loop import Training, run_loop
from .setup import guard_task
from .sft_setup import Example, SFTRun, sft_setup
from .step_rollouts import step_seed
from .run_result import RunResult, check_before


@lru_cache(maxsize=4)
def _pass_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.random.default_rng([seed, epoch]).permutation(n))


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """The demonstrations of step `step` (from 1): a seeded order a pass over the n, passes end to end."""
    return [
        _pass_order(n, seed, position // n)[position % n]
        for position in range((step - 1) * batch_size, step * batch_size)
    ]


def micro_batches(examples: list[Example], size: int) -> list[list[Example]]:
    """Pieces of at most `size` rows, the longest together, so that padding to a piece's longest wastes
    little."""
    ordered = sorted(examples, key=lambda e: len(e[0]), reverse=True)
    return [ordered[i : i + size] for i in range(0, len(ordered), max(size, 1))]


def trained_count(examples: list[Example]) -> int:
    """Tokens the loss counts: trained tokens after the first (the first is never a target)."""
    return int(sum(sum(flags[1:]) for _, flags in examples))


def head_chunk(model, tokens: mx.array, setting: int | None) -> int | None:
    """Positions per vocabulary-projection chunk for a micro-batch of `tokens` (train's rule,
    step_update.head_chunk: a 150k vocabulary's float32 logits are gigabytes a micro-batch)."""
    return step_update.head_chunk(setting, model, tokens.shape[0], tokens.shape[1] - 1)


def sft_step(
    model,
    optimizer,
    examples: list[Example],
    pad_id: int,
    micro_batch_size: int,
    max_grad_norm: float,
    chunk: int | None = None,
) -> dict:
    """One optimizer step on a batch of demonstrations; its metrics."""
    start = time.perf_counter()
    count = trained_count(examples)
    grads, loss_sum = None, 0.0
    # train's CPU rule: fewer rows a pass when their activations would pass the budget
    # (exact at any size: the loss is normalised by the whole batch's trained tokens)
    longest = max(len(ids) for ids, _ in examples)
    size = memory_bound_size(micro_batch_size, model, longest - 1)
    for part in micro_batches(examples, size):
        tokens, trained = pad_rows(part, pad_id)
        loss, g = sft_gradients(model, tokens, trained, max(count, 1), head_chunk(model, tokens, chunk))
        grads = g if grads is None else tree_map(mx.add, grads, g)
        mx.eval(grads, loss)
        loss_sum += loss.item()
    grads, norm = optim.clip_grad_norm(grads, max_grad_norm)
    norm = norm.item()
    finite = math.isfinite(norm) and math.isfinite(loss_sum)
    if finite:  # a NaN/Inf step would poison the weights: leave them untouched
        optimizer.update(model, grads)
        mx.eval(model.trainable_parameters(), optimizer.state)
    seconds = time.perf_counter() - start
    tokens = sum(len(ids) for ids, _ in examples)
    return {
        "loss": loss_sum,
        "grad_norm": norm,
        "grad_clipped": norm > max_grad_norm,
        "skipped_updates": 0 if finite else 1,
        "update/skipped": not finite,
        "update/nonfinite": 0 if finite else 1,
        "tokens": tokens,
        "trained_tokens": count,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "lr": optimizer.state["learning_rate"].item() if "learning_rate" in optimizer.state else None,
        "time/step_s": seconds,
    }


def validation_loss(
    model, examples: list[Example], pad_id: int, micro_batch_size: int, chunk: int | None = None
) -> float | None:
    """The mean cross-entropy of the held-out demonstrations' trained tokens (None: none held out)."""
    count = trained_count(examples)
    if not count:
        return None
    was_training = model.training
    model.eval()
    total = 0.0
    for part in micro_batches(examples, micro_batch_size):
        tokens, trained = pad_rows(part, pad_id)
        total += sft_loss(
            model, tokens, trained, count, head_chunk(model, tokens, chunk), differentiated=False
        ).item()
    model.train(was_training)
    return total


def guard_checks(run: SFTRun) -> None:
    """A built-in task's held-out checks guarded as train's are (setup.py's guard_task, with this run's
    model): rows without a column its rewards need or with a prompt too long for the context left out
    (on_bad_data), every reward call bounded by reward_timeout; the screen's notes join the run's warnings."""
    known = len(run.task.warnings)
    guard_task(run.task, run.config, run.tokenizer, context_length(run.model))
    run.warnings += run.task.warnings[known:]


def pad_id_of(tokenizer) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad if pad is not None else tokenizer.eos_token_id)


class SFTTraining(Training):
    """sft's part of the run loop (loop.py): its step, its checks (the validation loss, and a built-in task's
    held-out accuracy before and after) and the validation loss before the first step, kept in checkpoints."""

    def __init__(self, run: SFTRun, run_dir: Path):
        c = run.config
        super().__init__(
            "sft",
            c,
            run_dir,
            run.model,
            run.optimizer,
            run.adapter_config,
            run.warnings,
            run.trained_rows,
            c.task,
            {
                "task": run.task,
                "notes": run.notes,
                "sft": run.source,
                "examples": len(run.train),
                "held_out": len(run.valid),
            },
        )
        self.run = run
        self.pad, self.chunk = pad_id_of(run.tokenizer), c.logprob_chunk_size
        self.loss_before = self.loss_after = None

    def step(self, step: int) -> tuple[dict, list[dict]]:
        c, run = self.config, self.run
        self.model.train()
        mx.random.seed(step_seed(c.seed, step))  # LoRA dropout's masks: the same on a resumed run
        batch = [run.train[i] for i in batch_indices(len(run.train), c.batch_size, step, c.seed)]
        metrics = sft_step(
            self.model, self.optimizer, batch, self.pad, c.micro_batch_size, c.max_grad_norm, self.chunk
        )
        return {"step": step, **metrics}, []

    def validation_loss(self) -> float | None:
        return validation_loss(self.model, self.run.valid, self.pad, self.config.micro_batch_size, self.chunk)

    def check(self, when: str | int) -> tuple[dict, dict]:
        loss = self.validation_loss()  # cheap and always measured; the accuracy is a decode of each problem
        if when not in ("before", "after"):
            return {"val_loss": loss, "accuracy": None}, {"val_loss": loss}
        run, checks = self.run, check_before if when == "before" else run_result.evaluate
        result = {"accuracy": None, "n": 0}
        if run.task:
            result = checks(self.model, run.tokenizer, run.task, self.config)
        if when == "before":
            self.loss_before = loss
        else:
            self.loss_after = loss
        return {"val_loss": loss, **result}, {"val_loss": loss, "eval/accuracy": result["accuracy"]}

    def state_dict(self, step: int) -> dict:
        return {"val_loss_before": self.loss_before, "rng": {"seed": self.config.seed}}

    def load_state_dict(self, state: dict, training_state: dict) -> None:
        super().load_state_dict(state, training_state)
        self.loss_before = state.get("val_loss_before")

    def finish(self, result: RunResult, after: dict) -> tuple[RunResult, dict]:
        return result, {"val_loss_before": self.loss_before, "val_loss_after": self.loss_after}


def sft(config: TrainConfig, on_event: Callable[[str, dict], None] | None = None) -> RunResult:
    """Run (or resume) a supervised fine-tuning run; events as train()'s ("start", "eval", "step",
    "checkpoint", "health", "time_limit", "stopped", "end"), so the same display draws it."""
    began = time.perf_counter()  # time_limit_minutes counts from here: the model's load included
    run_dir = Path(
        config.resume
        or config.output
        or Path("checkpoints") / f"sft-{config.task}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    run = sft_setup(config, writable=run_dir if dist.is_main() else None)
    if run.task is not None:
        guard_checks(run)
    return run_loop(SFTTraining(run, run_dir), on_event, began)
