"""The supervised fine-tuning loop: demonstrations in, a masked cross-entropy step at a time.

One step takes the next `batch_size` demonstrations (each epoch a fresh order drawn from the
seed and the epoch's number alone, so a resumed run takes the same ones), pads each
micro-batch of `micro_batch_size` rows to its longest, sums the micro-batches' gradients of
the loss normalised by the batch's trained tokens (update/sft_loss.py), clips their global
norm at `max_grad_norm` (the norm before clipping is logged) and steps AdamW on train's
warmup + cosine schedule. A step whose loss or gradient is not finite leaves the weights
alone, and `max_nonfinite_steps` of them in a row stop the run (run/health.py).

The run folder is train's: config.yaml, metrics.jsonl (one row a step: loss, val_loss when
measured, tokens_per_s, lr, grad_norm, grad_clipped), health.jsonl, checkpoints/ with exact
resume, the adapters, summary.json. The validation loss on held-out demonstrations is
measured before the first step, every `eval_steps` and at the end; a built-in task's run
also measures the held-out accuracy before (unless eval_before is false) and after, as train does:
over the rows train's check reads, each reward call bounded by reward_timeout (setup.py's guard_task).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from ..config import TrainConfig, dump_yaml
from ..tasks.splits import record_training_rows
from ..models.adapters import save_adapters
from ..update.sft_loss import pad_rows, sft_gradients, sft_loss
from . import checkpoint as ckpt
from . import run_result, step_update
from .health import HealthMonitor, TrainingStopped, stop_run
from .interrupt import steps_until_ctrl_c
from .setup import guard_task
from .sft_setup import Example, SFTRun, sft_setup
from .step_rollouts import step_seed
from .run_result import RunResult, check_before


@lru_cache(maxsize=4)
def _pass_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.random.default_rng([seed, epoch]).permutation(n))


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """The demonstrations of step `step` (from 1): a seeded order a pass over the n, passes end to end."""
    return [_pass_order(n, seed, position // n)[position % n]
            for position in range((step - 1) * batch_size, step * batch_size)]


def micro_batches(examples: list[Example], size: int) -> list[list[Example]]:
    """Pieces of at most `size` rows, the longest together, so that padding to a piece's longest wastes little."""
    ordered = sorted(examples, key=lambda e: len(e[0]), reverse=True)
    return [ordered[i:i + size] for i in range(0, len(ordered), max(size, 1))]


def trained_count(examples: list[Example]) -> int:
    """Tokens the loss counts: trained tokens after the first (the first is never a target)."""
    return int(sum(sum(flags[1:]) for _, flags in examples))


def head_chunk(model, tokens: mx.array, setting: int | None) -> int | None:
    """Positions per vocabulary-projection chunk for a micro-batch of `tokens` (train's rule,
    step_update.head_chunk: a 150k vocabulary's float32 logits are gigabytes a micro-batch)."""
    return step_update.head_chunk(setting, model, tokens.shape[0], tokens.shape[1] - 1)


def sft_step(model, optimizer, examples: list[Example], pad_id: int, micro_batch_size: int,
             max_grad_norm: float, chunk: int | None = None) -> dict:
    """One optimizer step on a batch of demonstrations; its metrics."""
    start = time.perf_counter()
    count = trained_count(examples)
    grads, loss_sum = None, 0.0
    for part in micro_batches(examples, micro_batch_size):
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
    return {"loss": loss_sum, "grad_norm": norm, "grad_clipped": norm > max_grad_norm,
            "skipped_updates": 0 if finite else 1, "update/skipped": not finite, "update/nonfinite": 0 if finite else 1,
            "tokens": tokens, "trained_tokens": count,
            "tokens_per_s": tokens / seconds if seconds > 0 else None,
            "lr": optimizer.state["learning_rate"].item() if "learning_rate" in optimizer.state else None,
            "time/step_s": seconds}


def validation_loss(model, examples: list[Example], pad_id: int, micro_batch_size: int,
                    chunk: int | None = None) -> float | None:
    """The mean cross-entropy of the held-out demonstrations' trained tokens (None: none held out)."""
    count = trained_count(examples)
    if not count:
        return None
    was_training = model.training
    model.eval()
    total = 0.0
    for part in micro_batches(examples, micro_batch_size):
        tokens, trained = pad_rows(part, pad_id)
        total += sft_loss(model, tokens, trained, count, head_chunk(model, tokens, chunk),
                          differentiated=False).item()
    model.train(was_training)
    return total


def guard_checks(run: SFTRun) -> None:
    """A built-in task's held-out checks guarded as train's are (setup.py's guard_task, with this run's model):
    rows without a column its rewards need or with a prompt too long for the context left out (on_bad_data),
    every reward call bounded by reward_timeout; the screen's notes join the run's warnings."""
    known = len(run.task.warnings)
    guard_task(run.task, run.config, run.model, run.tokenizer)
    run.warnings += run.task.warnings[known:]


def pad_id_of(tokenizer) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad if pad is not None else tokenizer.eos_token_id)


def sft(config: TrainConfig, on_event: Callable[[str, dict], None] | None = None) -> RunResult:
    """Run (or resume) a supervised fine-tuning run; events as train()'s ("start", "eval", "step",
    "checkpoint", "health", "stopped", "end"), so the same display draws it."""
    emit = on_event or (lambda kind, data: None)
    run_dir = Path(config.resume or config.output or
                   Path("checkpoints") / f"sft-{config.task}-{time.strftime('%Y%m%d-%H%M%S')}")
    run = sft_setup(config, writable=run_dir)
    config = run.config  # from a run folder (--model RUN): with that run's adapter settings, as config.yaml keeps
    if run.task is not None:
        guard_checks(run)
    model, tokenizer, optimizer = run.model, run.tokenizer, run.optimizer
    pad, mb, chunk = pad_id_of(tokenizer), config.micro_batch_size, config.logprob_chunk_size

    start_step, state = 0, {}
    loaded = ckpt.load_latest(run_dir) if config.resume else None
    if loaded is not None:
        weights, opt_state, state, notes = loaded
        run.warnings += notes
        model.load_weights(list(weights.items()), strict=False)
        optimizer.state = opt_state
        start_step = int(state["step"])
    if config.resume:  # records past the checkpoint (and lines cut by a kill) are dropped
        for name in ("metrics.jsonl", "health.jsonl"):
            ckpt.truncate_jsonl(run_dir / name, start_step if loaded is not None else -1)
    monitor = HealthMonitor.from_config(config, run_dir if loaded is not None else None)
    ckpt.atomic_write_text(run_dir / "config.yaml", dump_yaml(replace(config, overwrite=False)))
    record_training_rows(run_dir, run.trained_rows, config.task, config.data)  # what compare keeps apart
    emit("start", {"run_dir": str(run_dir), "task": run.task, "config": config, "resumed_from": start_step,
                   "warnings": run.warnings, "notes": run.notes, "sft": run.source,
                   "examples": len(run.train), "held_out": len(run.valid)})

    before, loss_before = state.get("eval_before"), state.get("val_loss_before")
    if loaded is None:  # the validation loss is cheap and always measured; the accuracy is a decode of each problem
        loss_before = validation_loss(model, run.valid, pad, mb, chunk)
        result = check_before(model, tokenizer, run.task, config) if run.task else {"accuracy": None, "n": 0}
        before = result["accuracy"]
        ckpt.append_jsonl(run_dir / "metrics.jsonl", [{"step": 0, "val_loss": loss_before, "eval/accuracy": before,
                                             "before": True}])
        emit("eval", {"when": "before", "val_loss": loss_before, **result})

    def save(step: int):
        ckpt.save_checkpoint(run_dir, step, dict(tree_flatten(model.trainable_parameters())), run.adapter_config,
                             optimizer.state, {"eval_before": before, "val_loss_before": loss_before,
                                               "data_position": step * config.batch_size,
                                               "rng": {"seed": config.seed}},
                             keep_last=config.keep_checkpoints)
        save_adapters(model, run_dir, run.adapter_config)
        emit("checkpoint", {"step": step})

    def stop_on_ctrl_c(step: int) -> str:
        newest = ckpt.latest_checkpoint(run_dir)
        if newest is None or newest.name != ckpt.checkpoint_name(step):
            save(step)
        return f"interrupted after step {step}, checkpoint saved; continue with: mlx-grpo sft --resume {run_dir}"

    history, last_step = [], start_step
    model.train()
    for step in steps_until_ctrl_c(range(start_step + 1, config.steps + 1), stop_on_ctrl_c):
        mx.random.seed(step_seed(config.seed, step))  # LoRA dropout's masks: the same on a resumed run
        batch = [run.train[i] for i in batch_indices(len(run.train), config.batch_size, step, config.seed)]
        metrics = {"step": step, **sft_step(model, optimizer, batch, pad, mb, config.max_grad_norm, chunk)}
        if config.eval_steps and step % config.eval_steps == 0 and step < config.steps:
            metrics["val_loss"] = validation_loss(model, run.valid, pad, mb, chunk)
            emit("eval", {"when": step, "val_loss": metrics["val_loss"], "accuracy": None})
        last_step = step
        ckpt.append_jsonl(run_dir / "metrics.jsonl", [metrics])
        history.append(metrics)
        emit("step", {"metrics": metrics, "records": [], "total": config.steps})
        events = monitor.observe(metrics)
        ckpt.append_jsonl(run_dir / "health.jsonl", events)
        for event in events:
            emit("health", event)
        if monitor.stop_reason:
            line = stop_run(run_dir, monitor.stop_reason)
            emit("stopped", {"line": line})
            raise TrainingStopped(line)
        if step % config.save_every == 0 or step == config.steps:
            save(step)

    if start_step >= config.steps and ckpt.latest_checkpoint(run_dir) is None:
        save(config.steps)
    loss_after = validation_loss(model, run.valid, pad, mb, chunk)
    result = run_result.evaluate(model, tokenizer, run.task, config) if run.task else {"accuracy": None, "n": 0}
    emit("eval", {"when": "after", "val_loss": loss_after, **result})
    ckpt.append_jsonl(run_dir / "metrics.jsonl", [{"step": last_step, "val_loss": loss_after,
                                         "eval/accuracy": result["accuracy"], "final": True}])
    outcome = RunResult(run_dir, before, result["accuracy"], result["n"], history)
    ckpt.atomic_write_json(run_dir / "summary.json", {
        "accuracy_before": before, "accuracy_after": result["accuracy"], "eval_n": result["n"],
        "val_loss_before": loss_before, "val_loss_after": loss_after, "steps": last_step,
        "eval_seconds": result.get("seconds"),
        "line": outcome.summary_line()})
    emit("end", {"result": outcome, "val_loss_before": loss_before, "val_loss_after": loss_after})
    return outcome
