"""The GRPO loop: rollout, score, advantage, update(s), log, checkpoint, eval.

One step:
  1. take `batch_size` prompts (a fixed, seeded order, so a resumed run sees the same ones);
  2. sample `group_size` completions for each, keeping ids and behaviour log-probs;
  3. score them and compute group-baseline advantages;
  4. `num_iterations` times: accumulate gradients over micro-batches, clip the
     global norm, step AdamW (warmup + cosine schedule): update/step.py;
  5. append metrics and completions to the run folder; checkpoint every `save_every`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map

from ..config import TrainConfig, dump_yaml
from ..models.adapters import save_adapters
from ..sampling.kinds import rollouts_for
from ..sampling.progress import PROGRESS
from ..tasks.registry import Task, token_budget
from ..tasks.rewarding import part_means, reward_metrics
from ..update.advantages import advantage_stats, group_advantages, zero_std_frac
from ..update.batch import (MicroBatch, RolloutBatch, batch_shape, build_batch, carries_signal, groups_with_signal,
                            memory_bound_size, micro_batches)
from ..update.losses import BatchShape, LossSettings
from ..update.step import UpdateSettings, reference_logprobs, top_entropy_weights, update
from . import checkpoint as ckpt
from . import distributed as dist
from .health import HealthMonitor, TrainingStopped, stop_run
from .health_rewards import answer_pattern, reward_variance_shares
from .interrupt import steps_until_ctrl_c
from .guidance import guided_metrics
from .reporting import with_reporters
from .setup import RunState, make_optimizer, setup  # noqa: F401 (make_optimizer: also trainer's, as before)
from .step_metrics import reward_range
from .step_rollouts import collect_rollouts, step_seed

# Chunk the vocabulary projection when one micro-batch's logits would exceed this many floats.
_CHUNK_LOGITS_ABOVE = 2**27


@dataclass
class RunResult:
    run_dir: Path
    accuracy_before: float | None
    accuracy_after: float | None
    eval_n: int
    history: list[dict] = field(default_factory=list)

    def summary_line(self) -> str:
        if self.accuracy_before is None or self.accuracy_after is None:
            return f"run saved to {self.run_dir}"
        gain = self.accuracy_after - self.accuracy_before
        return (f"accuracy {self.accuracy_before:.2f} -> {self.accuracy_after:.2f} "
                f"({gain:+.2f}) on {self.eval_n} held-out problems")


def logprob_chunk(config: TrainConfig, model, batch: RolloutBatch, size: int) -> int | None:
    """Positions per vocabulary-projection chunk for micro-batches of `size` rows of `batch`.

    The setting when given; else 128 once a micro-batch's logits would pass _CHUNK_LOGITS_ABOVE
    floats, and None (no chunking) below that.
    """
    if config.logprob_chunk_size:
        return config.logprob_chunk_size
    vocab = model.model.embed_tokens.weight.shape[0] if hasattr(model, "model") else 0
    floats = min(size, len(batch.advantages)) * batch.completions.shape[1] * vocab
    return 128 if floats > _CHUNK_LOGITS_ABOVE else None


def update_settings(config: TrainConfig) -> UpdateSettings:
    loss = LossSettings(loss_type=config.loss, epsilon_low=config.epsilon_low, epsilon_high=config.epsilon_high,
                        delta=config.delta, beta=config.beta, sapo_tau_pos=config.sapo_tau_pos,
                        sapo_tau_neg=config.sapo_tau_neg, entropy_coef=config.entropy_coef)
    return UpdateSettings(loss, config.temperature, config.num_iterations, config.max_grad_norm, config.entropy_coef,
                          config.entropy_top_quantile)


def _kl_to_reference(parts: list[MicroBatch], ref_logps) -> float:
    """Mean k3 KL of the sampling policy to the reference, from the behaviour log-probs.

    With beta = 0 the loss has no KL term; this keeps KL visible anyway.
    """
    sums = {"total": 0.0, "count": 0.0}
    for mb, ref in zip(parts, ref_logps):
        log_ratio = ref - mb.behaviour_logp
        sums["total"] += ((mx.exp(log_ratio) - log_ratio - 1) * mb.mask).sum().item()
        sums["count"] += mb.mask.sum().item()
    sums = dist.sum_across_ranks(sums)  # each rank passes its share of the micro-batches
    return sums["total"] / max(sums["count"], 1.0)


def evaluate(model, tokenizer, task: Task, config: TrainConfig) -> dict:
    """Held-out accuracy: greedy completions, or greedy episodes for a multi-turn task."""
    return rollouts_for(task).evaluate(model, tokenizer, config)


def train_step(model, tokenizer, optimizer, task: Task, config: TrainConfig, step: int, ref_params) -> tuple[dict, list]:
    """One GRPO step; returns (metrics, completion records)."""
    start = time.perf_counter()
    mx.random.seed(step_seed(config.seed, step))
    mx.reset_peak_memory()
    sampled = collect_rollouts(model, tokenizer, task, config, step)
    g = config.group_size
    kept_rows = np.repeat(sampled.keep, g)
    completions = [c for c, k in zip(sampled.completions, kept_rows) if k]
    advantages = group_advantages(sampled.rewards[kept_rows], g, config.scale_rewards, config.scale_eps)

    update_start = time.perf_counter()
    model.train()
    # None: not measured this step. Step 1 samples from the starting weights, the reference itself: KL 0.
    metrics = {"step": step, "kl": 0.0 if step == 1 and config.kl_every > 0 else None}
    if completions:
        batch = build_batch(completions, advantages, g)
        if config.mask_truncated:  # cut-off completions contribute no token to the loss
            batch.mask[[c.truncated for c in completions]] = 0.0
        # bnpo normalises per micro-batch, so its size is part of the objective; the others are exact at any size.
        size = (config.micro_batch_size if config.loss == "bnpo" else
                memory_bound_size(config.micro_batch_size, model, batch.completions.shape[1]))
        chunk = logprob_chunk(config, model, batch, size)
        # The reference costs a forward pass: every step when the loss needs it,
        # every kl_every steps when it is only watched.
        watch_kl = config.beta == 0 and config.kl_every > 0 and step % config.kl_every == 0
        # A zero-advantage group adds nothing to the loss unless a KL or entropy term
        # does; bnpo divides by each micro-batch's own token count, so its micro-batches stay whole.
        skip_silent = config.beta == 0 and config.entropy_coef == 0 and config.loss != "bnpo"
        parts = micro_batches(groups_with_signal(batch) if skip_silent else batch, size)
        sizes = batch_shape(batch, size, token_budget(task, config))
        if watch_kl:  # over every group, silent ones included
            all_parts = micro_batches(batch, size) if skip_silent else parts
            mine = [all_parts[i] for i in dist.shard(len(all_parts))]
            metrics["kl"] = _kl_to_reference(mine, reference_logprobs(model, mine, ref_params, config.temperature, chunk))
        parts = [parts[i] for i in dist.shard(len(parts))]  # data-parallel: this rank's micro-batches
        # No signal: no token trained at all, or no advantage on a trained token and no KL or entropy term;
        # the gradient is zero either way.
        no_signal = not batch.mask.any() or (config.beta == 0 and config.entropy_coef == 0 and not carries_signal(batch))
        skip = config.skip_no_signal and no_signal
        ref_logps = (reference_logprobs(model, parts, ref_params, config.temperature, chunk)
                     if config.beta > 0 and not skip else None)
        weights = None  # entropy_top_quantile: the tokens that carry the loss, chosen over the whole step
        if config.entropy_top_quantile < 1 and not skip:
            silent = micro_batches(groups_with_signal(batch, silent=True), size) if skip_silent else []
            weights = top_entropy_weights(model, parts, [silent[i] for i in dist.shard(len(silent))],
                                          config.entropy_top_quantile, config.temperature, chunk,
                                          dist.all_gather_objects)
        prompt_tokens = sum(map(len, batch.prompts))
    else:  # every group was filtered out: zero gradients (the optimizer steps on them unless skip_no_signal)
        sizes, parts, ref_logps, chunk, prompt_tokens = BatchShape(0, 0, 0, config.max_tokens), [], None, None, 0
        no_signal, skip, weights = True, config.skip_no_signal, []
    metrics.update(update(model, optimizer, update_settings(config), sizes, parts, ref_logps, chunk,
                          dist.all_sum_tree, dist.sum_across_ranks, skip=skip, token_weights=weights))
    metrics["update/no_signal"] = no_signal
    # The rate the last update used (absent only if every update so far was skipped).
    metrics["lr"] = optimizer.state["learning_rate"].item() if "learning_rate" in optimizer.state else None
    update_s = time.perf_counter() - update_start

    grouped = sampled.rewards.reshape(-1, g)
    lengths = np.array([len(c.tokens) for c in sampled.completions])
    truncated = np.array([c.truncated for c in sampled.completions])
    trained_tokens = sum(len(c.tokens) for c in completions)
    metrics.update({
        "reward/mean": float(sampled.rewards.mean()),
        "reward/std": float(sampled.rewards.std()),
        "reward/best_of_n": float(grouped.max(axis=1).mean()),
        "reward/raw_mean": float(sampled.raw_rewards.mean()),
        **{f"reward/{name}/mean": value for name, value in part_means(sampled.parts).items()},
        **{f"reward/{name}/errors": n for name, n in sampled.errors.items()},
        **(advantage_stats(advantages) if completions else {}),  # over the groups trained on
        "frac_zero_std": zero_std_frac(sampled.rewards, g),  # over every sampled group
        "filter/dropped_frac": float(1 - sampled.keep.mean()),
        "filter/rounds": sampled.rounds,
        "completion/mean_length": float(lengths.mean()),
        **answer_pattern([c.text for c in sampled.completions]),
        **reward_variance_shares(sampled.parts, task.reward_weights, g, config.shaping),
        "completion/truncated_frac": float(truncated.mean()),
        "tokens_per_s": int(lengths.sum()) / max(sampled.seconds, 1e-9),
        "train/tokens_per_s": (prompt_tokens + trained_tokens) * config.num_iterations / max(update_s, 1e-9),
        "time/rollout_s": sampled.seconds,
        "time/update_s": update_s,
        **reward_metrics(task.reward_functions),  # a judge's time/judge_s and judge/unreadable_frac
        "time/step_s": time.perf_counter() - start,
        "memory/peak_gb": mx.get_peak_memory() / 1e9,
    })
    rollouts = rollouts_for(task)
    metrics.update(rollouts.step_metrics(sampled.completions))  # a multi-turn task's episode and tool metrics
    if task.curriculum:
        metrics.update(task.curriculum.metrics(task.train_rows))
    if config.guide:
        metrics.update(guided_metrics(task, sampled.completions, sampled.parts, g))

    records = []
    advantage_of = dict(zip(np.flatnonzero(kept_rows), advantages))
    for i, c in enumerate(sampled.completions):
        records.append({
            "step": step, "prompt": sampled.rows[c.prompt_index]["prompt"], "completion": c.text,
            "reward": float(sampled.rewards[i]), "raw_reward": float(sampled.raw_rewards[i]),
            "rewards": {name: values[i] for name, values in sampled.parts.items()},
            # None: the group was filtered out and not trained on
            "advantage": float(advantage_of[i]) if i in advantage_of else None,
            "finish_reason": c.finish_reason, "length": len(c.tokens),
            **({"guided": True} if getattr(c, "guided", False) else {}),
            **rollouts.record(tokenizer, c),  # an episode's turns as trained and masked text, its tool calls
        })
    for name, example in sampled.error_examples.items():
        metrics[f"reward/{name}/error_example"] = example
    return metrics, records


def _append_jsonl(path: Path, records: list[dict]) -> None:
    if not dist.is_main():  # data-parallel: rank 0 alone writes the run folder
        return
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")


def refreshed_reference(reference, policy, alpha: float):
    """TR-DPO-style reference update (Gorbatovski et al. 2024, arXiv:2404.09656):
    reference <- alpha * policy + (1 - alpha) * reference.

    With LoRA the mix is over the adapter matrices A and B themselves (exact
    for alpha = 1; an approximation of mixing the weight updates otherwise).
    """
    mixed = tree_map(lambda r, p: alpha * p + (1 - alpha) * r, reference, policy)
    mx.eval(mixed)
    return mixed


def run_step(run: RunState, step: int) -> tuple[dict, list]:
    """Step `step` of a run as train() and the API's Trainer.step take it: the GRPO step, then the
    reference's refresh when one is due, and the step's reward range (the health rules read it)."""
    c = run.config
    metrics, records = train_step(run.model, run.tokenizer, run.optimizer, run.task, c, step, run.ref_params)
    if c.ref_refresh_every and step % c.ref_refresh_every == 0:
        run.ref_params = refreshed_reference(run.ref_params, run.model.trainable_parameters(), c.ref_refresh_alpha)
        metrics["ref_refreshed"] = True
    metrics.update(reward_range(records))
    return metrics, records


def default_run_dir(config: TrainConfig) -> Path:
    return Path("checkpoints") / f"{config.task}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def train(config: TrainConfig, on_event: Callable[[str, dict], None] | None = None) -> RunResult:
    """Run (or resume) a training run described by `config`.

    on_event(kind, data) is told about progress: "start", "eval", "step", "rollout" (a multi-turn
    rollout's turn), "health" (a health rule fired: health.py), "checkpoint", "stopped" (too many
    NaN/Inf steps; TrainingStopped follows), "end". The CLI draws its live display from these.
    """
    main = dist.is_main()  # data-parallel (distributed.py): rank 0 alone writes and reports
    emit = with_reporters(config, on_event or (lambda kind, data: None)) if main else (lambda kind, data: None)
    PROGRESS.set(lambda state: emit("rollout", state))  # where each rollout and evaluation decode is
    run_dir = Path(config.resume or config.output or default_run_dir(config))
    # Task, policy, adapters, reference, optimizer: as the API's Trainer sets them up (setup.py); a bad
    # data file, reward or output folder is reported before the slow model load.
    run = setup(config, writable=run_dir if main else None)
    task, model, tokenizer, optimizer = run.task, run.model, run.tokenizer, run.optimizer

    start_step, state = 0, {}
    loaded = ckpt.load_latest(run_dir) if config.resume else None  # the newest intact checkpoint
    resumed = loaded is not None
    if resumed:
        weights, opt_state, state, notes = loaded
        task.warnings += notes  # damaged newer checkpoints that were passed over
        model.load_weights(list(weights.items()), strict=False)
        if "reference_weights" in opt_state:  # a refreshed reference travels with the optimizer state
            run.ref_params = opt_state.pop("reference_weights")
        optimizer.state = opt_state
        start_step = int(state["step"])
        if task.curriculum and "curriculum" in state:
            task.curriculum.load_state_dict(state["curriculum"])
    if config.resume and len(set(dist.all_gather_objects(start_step))) > 1:  # every rank reads its own copy
        raise ckpt.CheckpointError(f"--resume {run_dir}: the ranks found different checkpoints; with several "
                                   "machines, copy the run folder to the same path on each first")
    if config.resume and main:  # drop records past the checkpoint (all, if none was written) and lines cut by a kill
        for name in ("metrics.jsonl", "completions.jsonl", "health.jsonl"):
            ckpt.truncate_jsonl(run_dir / name, start_step)
    monitor = HealthMonitor.from_config(config, run_dir if resumed else None, token_budget(task, config))
    if main:
        ckpt.atomic_write_text(run_dir / "config.yaml", dump_yaml(config))
        if task.train_rows and not (run_dir / "prompt.txt").exists():  # what the model is shown, once per run
            seen = rollouts_for(task).prompt_as_seen(tokenizer, task.train_rows[0])
            ckpt.atomic_write_text(run_dir / "prompt.txt", seen)
    emit("start", {"run_dir": str(run_dir), "task": task, "config": config, "resumed_from": start_step,
                   "warnings": task.warnings, "notes": run.notes})

    before = state.get("eval_before")
    if before is None and not resumed:
        result = evaluate(model, tokenizer, task, config)
        before = result["accuracy"]
        emit("eval", {"when": "before", **result})

    history = []

    def save(step: int, metric: float | None = None):
        if not main:  # every rank holds the same weights; one writes them
            return
        weights = dict(tree_flatten(model.trainable_parameters()))
        training_state = optimizer.state
        if config.ref_refresh_every > 0:
            training_state = {**optimizer.state, "reference_weights": run.ref_params}
        ckpt.save_checkpoint(run_dir, step, weights, run.adapter_config, training_state,
                             {"eval_before": before, "data_position": step * config.batch_size,
                              **({"curriculum": task.curriculum.state_dict()} if task.curriculum else {}),
                              "rng": {"seed": config.seed, "next_step_seed": step_seed(config.seed, step + 1)}},
                             keep_last=config.keep_checkpoints, keep_best=config.keep_best, metric=metric)
        save_adapters(model, run_dir, run.adapter_config)
        emit("checkpoint", {"step": step})

    def stop_on_ctrl_c(step: int) -> str:  # the first Ctrl-C: keep the finished step, then leave
        newest = ckpt.latest_checkpoint(run_dir)
        if newest is None or newest.name != ckpt.checkpoint_name(step):
            save(step)
        return f"interrupted after step {step}, checkpoint saved; continue with: mlx-grpo train --resume {run_dir}"

    for step in steps_until_ctrl_c(range(start_step + 1, config.steps + 1), stop_on_ctrl_c):
        metrics, records = run_step(run, step)
        if config.eval_steps and step % config.eval_steps == 0 and step < config.steps:
            result = evaluate(model, tokenizer, task, config)
            metrics["eval/accuracy"] = result["accuracy"]
            if result.get("pass_at_k") is not None:
                metrics[f"eval/pass@{config.eval_pass_k}"] = result["pass_at_k"]
            emit("eval", {"when": step, **result})
        _append_jsonl(run_dir / "metrics.jsonl", [metrics])
        _append_jsonl(run_dir / "completions.jsonl", records)
        history.append(metrics)
        emit("step", {"metrics": metrics, "records": records, "total": config.steps})
        events = monitor.observe(metrics)  # health rules (docs/health.md)
        _append_jsonl(run_dir / "health.jsonl", events)
        for event in events:
            emit("health", event)
        if monitor.stop_reason:  # too many NaN/Inf steps in a row: stop before any further checkpoint
            line = stop_run(run_dir, monitor.stop_reason) if main else monitor.stop_reason
            emit("stopped", {"line": line})
            raise TrainingStopped(line)
        evaluated = config.keep_best and "eval/accuracy" in metrics  # keep_best compares evaluated checkpoints
        if step % config.save_every == 0 or step == config.steps or evaluated:
            save(step, metrics.get("eval/accuracy"))

    if start_step >= config.steps and ckpt.latest_checkpoint(run_dir) is None:
        save(config.steps)
    result = evaluate(model, tokenizer, task, config)
    emit("eval", {"when": "after", **result})
    if config.keep_best and result["accuracy"] is not None:  # the final weights compete for best too
        save(max(start_step, config.steps), result["accuracy"])
    final = {"step": config.steps, "eval/accuracy": result["accuracy"], "final": True}
    if result.get("pass_at_k") is not None:
        final[f"eval/pass@{config.eval_pass_k}"] = result["pass_at_k"]
    _append_jsonl(run_dir / "metrics.jsonl", [final])
    outcome = RunResult(run_dir, before, result["accuracy"], result["n"], history)
    if main:
        ckpt.atomic_write_json(run_dir / "summary.json", {
            "accuracy_before": before, "accuracy_after": result["accuracy"], "eval_n": result["n"],
            "steps": config.steps, "line": outcome.summary_line(),
        })
    emit("end", {"result": outcome})
    return outcome
