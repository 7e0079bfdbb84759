"""The GRPO loop: rollout, score, advantage, update(s), log, checkpoint, eval.

One step (`train_step`), a call a stage:
  1. collect: take `batch_size` prompts (a fixed, seeded order, so a resumed run sees the
     same ones), sample `group_size` completions (or episodes) for each, keeping ids and
     behaviour log-probs, score them and filter the groups: step_rollouts.py;
  2. choose what to train: the kept groups' completions and their group-baseline
     advantages; 3. prepare the update: micro-batches, the reference, KL: step_update.py;
  4. update, `num_iterations` times: accumulate gradients over micro-batches, clip the
     global norm, step AdamW (warmup + cosine schedule): update/step.py;
  5. record the step's metrics and completions: step_metrics.py. The loop appends them to
     the run folder and checkpoints every `save_every`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Callable

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

from ..config import TrainConfig, dump_yaml
from ..tasks.splits import record_training_rows
from ..models.adapters import save_adapters
from ..sampling.kinds import rollouts_for
from ..sampling.progress import PROGRESS
from ..tasks.registry import Task, token_budget
from ..tasks.rewarding import reward_name
from . import checkpoint as ckpt
from . import distributed as dist
from . import run_result
from .health import HealthMonitor, TrainingStopped, stop_run
from .interrupt import steps_until_ctrl_c
from .reporting import with_reporters
# evaluate: the API reads it here; the run looks it up in run_result, the one place a test replaces it
from .run_result import RunResult, check_before, evaluate  # noqa: F401
from .setup import RunState, make_optimizer, setup  # noqa: F401 (make_optimizer: also trainer's, as before)
from .step_metrics import completion_records, reward_range, step_metrics
from .step_rollouts import collect_rollouts, step_seed
from .step_update import apply_update, choose_trained, prepare_update, update_settings  # noqa: F401 (also trainer's)
from .warm_start import WarmStart, grpo_config, no_time_after, run_warm_start, with_warm_start


def train_step(model, tokenizer, optimizer, task: Task, config: TrainConfig, step: int, ref_params) -> tuple[dict, list]:
    """One GRPO step; returns (metrics, completion records)."""
    start = time.perf_counter()
    mx.random.seed(step_seed(config.seed, step))
    mx.reset_peak_memory()
    sampled = collect_rollouts(model, tokenizer, task, config, step)  # sampled, scored, filtered (step_rollouts.py)
    trained = choose_trained(sampled, config)  # the kept groups' completions and advantages (step_update.py)
    update_start = time.perf_counter()
    model.train()
    ready = prepare_update(model, trained, task, config, step, ref_params)  # micro-batches, reference, KL
    metrics = {"step": step, **apply_update(model, optimizer, ready, config)}  # optimizer steps (step_update.py)
    update_s = time.perf_counter() - update_start
    metrics.update(step_metrics(task, config, sampled, trained, ready.prompt_tokens, update_s, start))
    return metrics, completion_records(tokenizer, task, step, sampled, trained)


def eval_row(step: int, result: dict, config: TrainConfig, **mark) -> dict:
    """A held-out evaluation as its own metrics.jsonl row: before training (step 0, before=True) or the
    final one (final=True); files.training_rows leaves both out of the training steps."""
    row = {"step": step, "eval/accuracy": result["accuracy"], **mark}
    if result.get("pass_at_k") is not None:
        row[f"eval/pass@{config.eval_pass_k}"] = result["pass_at_k"]
    return row


def _append_jsonl(path: Path, records: list[dict]) -> None:
    if dist.is_main():  # data-parallel: rank 0 alone writes the run folder
        ckpt.append_jsonl(path, records)


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
    refresh_reference_if_due(run, step, metrics)
    metrics.update(reward_range(records))
    return metrics, records


def refresh_reference_if_due(run: RunState, step: int, metrics: dict) -> None:
    """After step `step`'s update: the reference's refresh every `ref_refresh_every` steps (marked in metrics)."""
    c = run.config
    o = c.objective
    if o.ref_refresh_every and step % o.ref_refresh_every == 0:
        run.ref_params = refreshed_reference(run.ref_params, run.model.trainable_parameters(), o.ref_refresh_alpha)
        metrics["ref_refreshed"] = True


def before_check(model, tokenizer, task: Task, config: TrainConfig, stage: WarmStart | None) -> dict:
    """GRPO's held-out check before its first step: a warm start's check after its last step (already
    measured, so kept under eval_before: false too: it is the run's accuracy after the warm start), else
    check_before's, as sft's."""
    if stage is not None and stage.check:
        return stage.check
    return check_before(model, tokenizer, task, config)


def past_time_limit(config: TrainConfig, elapsed: float, history: list[dict], eval_seconds: float) -> bool:
    """Whether one more step (at the mean step time so far) and the final evaluation (as long as the first)
    would end past `time_limit_minutes` from the run's start. Never before the first step this process runs."""
    if not config.time_limit_minutes or not history:
        return False
    mean_step = sum(m["time/step_s"] for m in history) / len(history)
    return elapsed + mean_step + eval_seconds > 60 * config.time_limit_minutes


def default_run_dir(config: TrainConfig) -> Path:
    return Path("checkpoints") / f"{config.task}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def train(config: TrainConfig, on_event: Callable[[str, dict], None] | None = None) -> RunResult:
    """Run (or resume) a training run described by `config`.

    on_event(kind, data) is told about progress: "start", "eval", "step", "time_limit" (time_limit_minutes
    ended the run early: it then saves and evaluates as at the end), "rollout" (a multi-turn
    rollout's turn), "health" (a health rule fired: health.py), "checkpoint", "stopped" (too many
    NaN/Inf steps; TrainingStopped follows), "end", and "warm_start" (an sft event of the warm start
    before GRPO: {"kind", "data"}, run/warm_start.py). The CLI draws its live display from these.
    """
    main = dist.is_main()  # data-parallel (distributed.py): rank 0 alone writes and reports
    emit = with_reporters(config, on_event or (lambda kind, data: None)) if main else (lambda kind, data: None)
    listening = PROGRESS.set(lambda state: emit("rollout", state))  # where each rollout and evaluation decode is
    try:
        return _train(config, emit, main)
    finally:  # a later decode in this process (a notebook's, a test's) is not reported to this run
        PROGRESS.reset(listening)


def _train(config: TrainConfig, emit: Callable[[str, dict], None], main: bool) -> RunResult:
    began = time.perf_counter()  # time_limit_minutes counts from here: the model's load included
    run_dir = Path(config.resume or config.output or default_run_dir(config))
    stage = run_warm_start(config, run_dir, emit) if main else None  # sft first, into RUN/warm_start (warm_start.py)
    # Task, policy, adapters, reference, optimizer: as the API's Trainer sets them up (setup.py); a bad
    # data file, reward or output folder is reported before the slow model load.
    run = setup(grpo_config(config, stage), writable=run_dir if main else None)
    # from a run folder (--model RUN): with that run's adapter settings, as config.yaml keeps; the model named
    # is the one the command was given (after a warm start, GRPO's policy starts from RUN/warm_start)
    config = replace(run.config, model=config.model)
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
    if config.resume and main:  # drop records past the checkpoint and lines cut by a kill; with no checkpoint,
        kept = start_step if resumed else -1  # all of them, the step-0 evaluation too (it runs again)
        for name in ("metrics.jsonl", "completions.jsonl", "health.jsonl"):
            ckpt.truncate_jsonl(run_dir / name, kept)
    accuracy = reward_name(task.accuracy_reward) if task.accuracy_reward is not None else None  # accuracy_collapse
    monitor = HealthMonitor.from_config(config, run_dir if resumed else None, token_budget(task, config), accuracy)
    if main:
        # overwrite acts once, on this start: a --resume or a copy used as --config does not repeat it
        ckpt.atomic_write_text(run_dir / "config.yaml", dump_yaml(replace(config, overwrite=False)))
        record_training_rows(run_dir, task.train_rows, task.name, config.data)  # what compare keeps apart
        # what the model is shown: written by a fresh run (never an earlier one's), kept by a resume
        if task.train_rows and not (config.resume and (run_dir / "prompt.txt").exists()):
            seen = rollouts_for(task).prompt_as_seen(tokenizer, task.train_rows[0])
            ckpt.atomic_write_text(run_dir / "prompt.txt", seen)
    emit("start", {"run_dir": str(run_dir), "task": task, "config": config, "resumed_from": start_step,
                   "warnings": task.warnings, "notes": run.notes})

    # The held-out evaluation's time, measured before the first step and kept in each checkpoint: a resumed
    # run leaves room for its final evaluation too (past_time_limit).
    before, eval_seconds = state.get("eval_before"), state.get("eval_seconds", 0.0)
    if before is None and not resumed:  # after a warm start, its check after its last step is this one
        result = before_check(model, tokenizer, task, config, stage)
        before, eval_seconds = result["accuracy"], result.get("seconds", 0.0)
        if before is not None:  # on file at once: an interrupted run keeps it too (plot, inspect)
            _append_jsonl(run_dir / "metrics.jsonl", [eval_row(0, result, config, before=True)])
        emit("eval", {"when": "before", **result})

    history = []

    def save(step: int, metric: float | None = None):
        if not main:  # every rank holds the same weights; one writes them
            return
        weights = dict(tree_flatten(model.trainable_parameters()))
        training_state = optimizer.state
        if config.objective.ref_refresh_every > 0:
            training_state = {**optimizer.state, "reference_weights": run.ref_params}
        ckpt.save_checkpoint(run_dir, step, weights, run.adapter_config, training_state,
                             {"eval_before": before, "eval_seconds": eval_seconds,
                              "data_position": step * config.batch_size,
                              **({"curriculum": task.curriculum.state_dict()} if task.curriculum else {}),
                              "rng": {"seed": config.seed, "next_step_seed": step_seed(config.seed, step + 1)}},
                             keep_last=config.keep_checkpoints, keep_best=config.keep_best, metric=metric)
        save_adapters(model, run_dir, run.adapter_config)
        emit("checkpoint", {"step": step})

    def save_unless_saved(step: int):  # a run that stops early keeps its last finished step
        newest = ckpt.latest_checkpoint(run_dir)
        if newest is None or newest.name != ckpt.checkpoint_name(step):
            save(step)

    def stop_on_ctrl_c(step: int) -> str:  # the first Ctrl-C: keep the finished step, then leave
        save_unless_saved(step)
        return f"interrupted after step {step}, checkpoint saved; continue with: mlx-grpo train --resume {run_dir}"

    last_step = start_step
    for step in steps_until_ctrl_c(range(start_step + 1, config.steps + 1), stop_on_ctrl_c):
        elapsed = time.perf_counter() - began
        if past_time_limit(config, elapsed, history, eval_seconds) or no_time_after(config, stage, elapsed, eval_seconds):
            emit("time_limit", {"step": last_step, "total": config.steps, "minutes": config.time_limit_minutes})
            save_unless_saved(last_step)
            break
        last_step = step
        metrics, records = run_step(run, step)
        if config.eval_steps and step % config.eval_steps == 0 and step < config.steps:
            result = run_result.evaluate(model, tokenizer, task, config)
            # with no check before the first step (eval_before: false), the first timed check is the estimate
            eval_seconds = eval_seconds or result.get("seconds", 0.0)
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
    result = run_result.evaluate(model, tokenizer, task, config)
    emit("eval", {"when": "after", **result})
    if config.keep_best and result["accuracy"] is not None:  # the final weights compete for best too
        save(last_step, result["accuracy"])
    _append_jsonl(run_dir / "metrics.jsonl", [eval_row(last_step, result, config, final=True)])
    outcome = with_warm_start(RunResult(run_dir, before, result["accuracy"], result["n"], history), stage)
    if main:
        ckpt.atomic_write_json(run_dir / "summary.json", {
            "accuracy_before": outcome.accuracy_before, "accuracy_after": result["accuracy"], "eval_n": result["n"],
            **({"accuracy_after_warm_start": outcome.accuracy_after_warm_start} if stage else {}),
            "steps": last_step, "line": outcome.summary_line(),
        })
    emit("end", {"result": outcome})
    return outcome
