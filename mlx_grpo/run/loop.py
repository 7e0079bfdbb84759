"""The run loop `train` (GRPO, trainer.py) and `sft` (sft.py) share: one place for what a run folder holds.

A kind of training hands `run_loop` a Training: its model and optimizer, its step (`step(i)` ->
the step's metrics and completion records), its held-out check (`check(when)`) and the parts of a
checkpoint only it has (`state_dict`/`load_state_dict`: GRPO's curriculum and refreshed reference,
sft's validation loss before the first step). The loop does the rest, the same for both:

  1. resume: load the newest intact checkpoint, cut metrics/completions/health.jsonl back to it;
  2. write config.yaml and trained_rows.json (what compare keeps apart), tell the display "start";
  3. the check before the first step (a resumed run keeps the one in its checkpoint);
  4. the steps: the time limit, the step, a check every `eval_steps`, the records, health,
     a checkpoint every `save_every` (a Ctrl-C saves the finished step and leaves);
  5. the check after the last step, the final checkpoint and summary.json.

Only the main rank (distributed.py) writes files and reports; events also feed the loggers of
`report_to` (reporting.py). `time_limit_minutes` counts from `began`, the caller's start (the
model's load, and a warm start before GRPO, included).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from mlx.utils import tree_flatten

from ..config import TrainConfig, dump_yaml
from ..models.adapters import save_adapters
from ..tasks.splits import record_training_rows
from . import checkpoint as ckpt
from . import distributed as dist
from .health import HealthMonitor, TrainingStopped, stop_run
from .interrupt import steps_until_ctrl_c
from .reporting import with_reporters
from .run_result import RunResult

Emit = Callable[[str, dict], None]


@dataclass
class Training:
    """What GRPO or sft brings to the run loop; a subclass defines `step` and `check`."""

    command: str  # "train" or "sft": what a Ctrl-C line says to continue with
    config: TrainConfig
    run_dir: Path
    model: object
    optimizer: object
    adapter_config: dict
    warnings: list[str]  # the "start" event's; a resume adds the damaged checkpoints it passed over
    trained_rows: list[dict]  # trained_rows.json's rows (tasks/splits.py) and their task's name
    task_name: str
    start: dict = field(default_factory=dict)  # more of the "start" event: the task, notes, sft's source ...
    budget: int | None = None  # health's token budget and accuracy reward (HealthMonitor.from_config)
    accuracy: str | None = None

    def step(self, step: int) -> tuple[dict, list[dict]]:
        """Step `step` (from 1): its metrics (with "step" and "time/step_s") and its completion records."""
        raise NotImplementedError

    def check(self, when: str | int) -> tuple[dict, dict]:
        """The held-out check "before" the first step, at step `when` (every eval_steps) or "after" the last:
        (the "eval" event's data: accuracy, n, seconds ..., the metrics it adds to a metrics.jsonl row;
        none before the first step: no row)."""
        raise NotImplementedError

    def state_dict(self, step: int) -> dict:
        """This kind's part of checkpoint `step`'s state."""
        return {}

    def training_state(self) -> dict:
        """What the checkpoint keeps beside the weights: the optimizer's state (and what travels with it)."""
        return self.optimizer.state

    def load_state_dict(self, state: dict, training_state: dict) -> None:
        """Take back a checkpoint's state and training state (the weights are loaded already)."""
        self.optimizer.state = training_state

    def out_of_time(self, elapsed: float, eval_seconds: float) -> bool:
        """A stop rule of this kind's beside past_time_limit (GRPO's: a warm start used the time up)."""
        return False

    def finish(self, result: RunResult, after: dict) -> tuple[RunResult, dict]:
        """The run's result from the loop's, and more fields for summary.json and the "end" event."""
        return result, {}


def _quiet(kind: str, data: dict) -> None:
    pass


def past_time_limit(config: TrainConfig, elapsed: float, history: list[dict], eval_seconds: float) -> bool:
    """Whether one more step (at the mean step time so far) and the final evaluation (as long as the first)
    would end past `time_limit_minutes` from the run's start. Never before this process's first step."""
    if not config.time_limit_minutes or not history:
        return False
    mean_step = sum(m["time/step_s"] for m in history) / len(history)
    return elapsed + mean_step + eval_seconds > 60 * config.time_limit_minutes


def run_loop(job: Training, on_event: Emit | None = None, began: float | None = None) -> RunResult:
    """Run (or resume) `job` to its config's `steps` in its run folder; events as train() lists them."""
    began = time.perf_counter() if began is None else began
    config, run_dir, model = job.config, job.run_dir, job.model
    main = dist.is_main()  # data-parallel: rank 0 alone writes the run folder and reports
    emit = with_reporters(config, on_event or _quiet) if main else _quiet

    def append(name: str, records: list[dict]) -> None:
        if main:
            ckpt.append_jsonl(run_dir / name, records)

    # Resume: the newest intact checkpoint's weights and state, the records past it dropped.
    start_step, state = 0, {}
    loaded = ckpt.load_latest(run_dir) if config.resume else None
    resumed = loaded is not None
    if resumed:
        weights, training_state, state, notes = loaded
        job.warnings += notes  # damaged newer checkpoints that were passed over
        model.load_weights(list(weights.items()), strict=False)
        job.load_state_dict(state, training_state)
        start_step = int(state["step"])
    if config.resume and len(set(dist.all_gather_objects(start_step))) > 1:  # every rank reads its own copy
        raise ckpt.CheckpointError(
            f"--resume {run_dir}: the ranks found different checkpoints; with several "
            "machines, copy the run folder to the same path on each first"
        )
    if config.resume and main:  # records past the checkpoint and lines cut by a kill; with no checkpoint,
        kept = start_step if resumed else -1  # all of them, the step-0 evaluation too (it runs again)
        for name in ("metrics.jsonl", "completions.jsonl", "health.jsonl"):
            ckpt.truncate_jsonl(run_dir / name, kept)
    monitor = HealthMonitor.from_config(config, run_dir if resumed else None, job.budget, job.accuracy)

    # The run's record: its settings (overwrite acts once, on this start: a --resume or a copy used as
    # --config does not repeat it) and the rows it trains on.
    if main:
        ckpt.atomic_write_text(run_dir / "config.yaml", dump_yaml(replace(config, overwrite=False)))
        record_training_rows(run_dir, job.trained_rows, job.task_name, config.data)
    emit(
        "start",
        {
            "run_dir": str(run_dir),
            "config": config,
            "resumed_from": start_step,
            "warnings": job.warnings,
            **job.start,
        },
    )

    # The check before the first step, on file at once (an interrupted run keeps it too: plot, inspect). Its
    # time is kept in each checkpoint: a resumed run leaves room for its final check too (past_time_limit).
    before, eval_seconds = state.get("eval_before"), state.get("eval_seconds", 0.0)
    if not resumed:
        result, row = job.check("before")
        before, eval_seconds = result["accuracy"], result.get("seconds", 0.0)
        if row:
            append("metrics.jsonl", [{"step": 0, **row, "before": True}])
        emit("eval", {"when": "before", **result})

    def save(step: int, metric: float | None = None) -> None:
        if not main:  # every rank holds the same weights; one writes them
            return
        weights = dict(tree_flatten(model.trainable_parameters()))
        ckpt.save_checkpoint(
            run_dir,
            step,
            weights,
            job.adapter_config,
            job.training_state(),
            {
                "eval_before": before,
                "eval_seconds": eval_seconds,
                "data_position": step * config.batch_size,
                **job.state_dict(step),
            },
            keep_last=config.keep_checkpoints,
            keep_best=config.keep_best,
            metric=metric,
        )
        save_adapters(model, run_dir, job.adapter_config)
        emit("checkpoint", {"step": step})

    def save_unless_saved(step: int) -> None:  # a run that stops early keeps its last finished step
        newest = ckpt.latest_checkpoint(run_dir)
        if newest is None or newest.name != ckpt.checkpoint_name(step):
            save(step)

    def stop_on_ctrl_c(step: int) -> str:  # the first Ctrl-C: keep the finished step, then leave
        save_unless_saved(step)
        return (
            f"interrupted after step {step}, checkpoint saved; "
            f"continue with: mlx-grpo {job.command} --resume {run_dir}"
        )

    history, last_step = [], start_step
    for step in steps_until_ctrl_c(range(start_step + 1, config.steps + 1), stop_on_ctrl_c):
        # Time limit: stop before a step that would leave no room for the final check.
        elapsed = time.perf_counter() - began
        if past_time_limit(config, elapsed, history, eval_seconds) or job.out_of_time(elapsed, eval_seconds):
            minutes = config.time_limit_minutes
            emit("time_limit", {"step": last_step, "total": config.steps, "minutes": minutes})
            save_unless_saved(last_step)
            break
        # The step, and the held-out check when one is due (its metrics join the step's).
        last_step = step
        metrics, records = job.step(step)
        if config.eval_steps and step % config.eval_steps == 0 and step < config.steps:
            result, row = job.check(step)
            # with no check before the first step (eval_before: false), the first timed check is the estimate
            eval_seconds = eval_seconds or result.get("seconds", 0.0)
            metrics.update(row)
            emit("eval", {"when": step, **result})
        # Records: metrics.jsonl, completions.jsonl, the display.
        append("metrics.jsonl", [metrics])
        append("completions.jsonl", records)
        history.append(metrics)
        emit("step", {"metrics": metrics, "records": records, "total": config.steps})
        # Health (docs/health.md): too many NaN/Inf steps in a row stop before any further checkpoint.
        events = monitor.observe(metrics)
        append("health.jsonl", events)
        for event in events:
            emit("health", event)
        if monitor.stop_reason:
            line = stop_run(run_dir, monitor.stop_reason) if main else monitor.stop_reason
            emit("stopped", {"line": line})
            raise TrainingStopped(line)
        # Checkpoint: every save_every, the last step, and each evaluated step under keep_best.
        evaluated = config.keep_best and "eval/accuracy" in metrics
        if step % config.save_every == 0 or step == config.steps or evaluated:
            save(step, metrics.get("eval/accuracy"))

    # The end: the check after the last step (it competes for best too), the summary.
    if start_step >= config.steps and ckpt.latest_checkpoint(run_dir) is None:
        save(config.steps)
    after, row = job.check("after")
    emit("eval", {"when": "after", **after})
    if config.keep_best and after["accuracy"] is not None:
        save(last_step, after["accuracy"])
    append("metrics.jsonl", [{"step": last_step, **row, "final": True}])
    outcome, more = job.finish(RunResult(run_dir, before, after["accuracy"], after["n"], history), after)
    if main:
        ckpt.atomic_write_json(
            run_dir / "summary.json",
            {
                "accuracy_before": outcome.accuracy_before,
                "accuracy_after": after["accuracy"],
                "eval_n": after["n"],
                **more,
                "steps": last_step,
                "eval_seconds": after.get("seconds"),
                "line": outcome.summary_line(),
            },
        )
    emit("end", {"result": outcome, **more})
    return outcome
