"""The GRPO loop: rollout, score, advantage, update(s), log, checkpoint, eval.

One step (`train_step`), a call a stage:
  1. collect: take `batch_size` prompts (a fixed, seeded order, so a resumed run sees the
     same ones), sample `group_size` completions (or episodes) for each, keeping ids and
     behaviour log-probs, score them and filter the groups: step_rollouts.py;
  2. choose what to train: the kept groups' completions and their group-baseline
     advantages; 3. prepare the update: micro-batches, the reference, KL: step_update.py;
  4. update, `num_iterations` times: accumulate gradients over micro-batches, clip the
     global norm, step AdamW (warmup + cosine schedule): update/step.py;
  5. record the step's metrics and completions: step_metrics.py.

`train` sets a run up (setup.py, after a warm start: warm_start.py) and hands its steps, checks and
checkpoint state (GRPOTraining) to the run loop sft shares (loop.py): the run folder, resume,
checkpoints, the time limit, health, the reporters and the summary.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Callable

import mlx.core as mx
from mlx.utils import tree_map

from ..config import TrainConfig
from ..sampling.kinds import rollouts_for
from ..sampling.progress import PROGRESS
from ..tasks.registry import Task, token_budget
from ..tasks.rewarding import reward_name
from . import checkpoint as ckpt
from . import distributed as dist
from . import run_result
from .loop import Training, run_loop

# evaluate: the API reads it here; the run looks it up in run_result, the one place a test replaces it
from .run_result import RunResult, check_before, evaluate  # noqa: F401
from .setup import RunState, make_optimizer, setup  # noqa: F401 (make_optimizer: also trainer's, as before)
from .step_metrics import completion_records, reward_range, step_metrics
from .step_rollouts import collect_rollouts, step_seed
from .step_update import apply_update, choose_trained, prepare_update, update_settings  # noqa: F401 (also trainer's)
from .warm_start import WarmStart, grpo_config, no_time_after, run_warm_start, with_warm_start


def train_step(
    model, tokenizer, optimizer, task: Task, config: TrainConfig, step: int, ref_params
) -> tuple[dict, list]:
    """One GRPO step; returns (metrics, completion records)."""
    start = time.perf_counter()
    mx.random.seed(step_seed(config.seed, step))
    mx.reset_peak_memory()
    sampled = collect_rollouts(
        model, tokenizer, task, config, step
    )  # sampled, scored, filtered (step_rollouts.py)
    trained = choose_trained(sampled, config)  # the kept groups' completions and advantages (step_update.py)
    update_start = time.perf_counter()
    model.train()
    ready = prepare_update(model, trained, task, config, step, ref_params)  # micro-batches, reference, KL
    metrics = {
        "step": step,
        **apply_update(model, optimizer, ready, config),
    }  # optimizer steps (step_update.py)
    update_s = time.perf_counter() - update_start
    metrics.update(step_metrics(task, config, sampled, trained, ready.prompt_tokens, update_s, start))
    return metrics, completion_records(tokenizer, task, step, sampled, trained)


def eval_fields(result: dict, config: TrainConfig) -> dict:
    """A held-out check's metrics: in its step's metrics.jsonl row, or its own row before training (step 0,
    before=True) or at the end (final=True); files.training_rows leaves those two out of the steps."""
    fields = {"eval/accuracy": result["accuracy"]}
    if result.get("pass_at_k") is not None:
        fields[f"eval/pass@{config.eval_pass_k}"] = result["pass_at_k"]
    return fields


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
    """After step `step`'s update: the reference's refresh every `ref_refresh_every` steps (marked in
    metrics)."""
    c = run.config
    o = c.objective
    if o.ref_refresh_every and step % o.ref_refresh_every == 0:
        run.ref_params = refreshed_reference(
            run.ref_params, run.model.trainable_parameters(), o.ref_refresh_alpha
        )
        metrics["ref_refreshed"] = True


def before_check(model, tokenizer, task: Task, config: TrainConfig, stage: WarmStart | None) -> dict:
    """GRPO's held-out check before its first step: a warm start's check after its last step (already
    measured, so kept under eval_before: false too: it is the run's accuracy after the warm start), else
    check_before's, as sft's."""
    if stage is not None and stage.check:
        return stage.check
    return check_before(model, tokenizer, task, config)


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
    on_event = on_event or (lambda kind, data: None)
    # where each rollout and evaluation decode is
    listening = PROGRESS.set(lambda state: on_event("rollout", state) if main else None)
    try:
        return _train(config, on_event, main)
    finally:  # a later decode in this process (a notebook's, a test's) is not reported to this run
        PROGRESS.reset(listening)


class GRPOTraining(Training):
    """GRPO's part of the run loop (loop.py): its step, its held-out checks and its checkpoint state."""

    def __init__(self, run: RunState, run_dir: Path, config: TrainConfig, stage: WarmStart | None):
        task = run.task
        accuracy = reward_name(task.accuracy_reward) if task.accuracy_reward is not None else None
        super().__init__(
            "train",
            config,
            run_dir,
            run.model,
            run.optimizer,
            run.adapter_config,
            task.warnings,
            task.train_rows,
            task.name,
            {"task": task, "notes": run.notes},
            token_budget(task, config),
            accuracy,
        )  # health's accuracy_collapse reads the reward
        self.run, self.task, self.stage = run, task, stage

    def step(self, step: int) -> tuple[dict, list[dict]]:
        return run_step(self.run, step)

    def check(self, when: str | int) -> tuple[dict, dict]:
        if when == "before":  # a warm start's check after its last step, else check_before's
            result = before_check(self.model, self.run.tokenizer, self.task, self.config, self.stage)
            return result, ({} if result["accuracy"] is None else eval_fields(result, self.config))
        result = run_result.evaluate(self.model, self.run.tokenizer, self.task, self.config)
        return result, eval_fields(result, self.config)

    def state_dict(self, step: int) -> dict:
        curriculum = {"curriculum": self.task.curriculum.state_dict()} if self.task.curriculum else {}
        seed = self.config.seed
        return {**curriculum, "rng": {"seed": seed, "next_step_seed": step_seed(seed, step + 1)}}

    def training_state(self) -> dict:  # a refreshed reference travels with the optimizer state
        if self.config.objective.ref_refresh_every > 0:
            return {**self.optimizer.state, "reference_weights": self.run.ref_params}
        return self.optimizer.state

    def load_state_dict(self, state: dict, training_state: dict) -> None:
        if "reference_weights" in training_state:
            self.run.ref_params = training_state.pop("reference_weights")
        self.optimizer.state = training_state
        if self.task.curriculum and "curriculum" in state:
            self.task.curriculum.load_state_dict(state["curriculum"])

    def out_of_time(self, elapsed: float, eval_seconds: float) -> bool:
        return no_time_after(self.config, self.stage, elapsed, eval_seconds)

    def finish(self, result: RunResult, after: dict) -> tuple[RunResult, dict]:
        outcome = with_warm_start(result, self.stage)
        return outcome, {"accuracy_after_warm_start": outcome.accuracy_after_warm_start} if self.stage else {}


def _train(config: TrainConfig, on_event: Callable[[str, dict], None], main: bool) -> RunResult:
    began = time.perf_counter()  # time_limit_minutes counts from here: the model's load included
    run_dir = Path(config.resume or config.output or default_run_dir(config))
    stage = run_warm_start(config, run_dir, on_event) if main else None  # sft first, into RUN/warm_start
    # Task, policy, adapters, reference, optimizer: as the API's Trainer sets them up (setup.py); a bad
    # data file, reward or output folder is reported before the slow model load.
    run = setup(grpo_config(config, stage), writable=run_dir if main else None)
    # from a run folder (--model RUN): with that run's adapter settings, as config.yaml keeps; the model named
    # is the one the command was given (after a warm start, GRPO's policy starts from RUN/warm_start)
    config = replace(run.config, model=config.model)
    # what the model is shown: written by a fresh run (never an earlier one's), kept by a resume
    if main and run.task.train_rows and not (config.resume and (run_dir / "prompt.txt").exists()):
        seen = rollouts_for(run.task).prompt_as_seen(run.tokenizer, run.task.train_rows[0])
        ckpt.atomic_write_text(run_dir / "prompt.txt", seen)
    return run_loop(GRPOTraining(run, run_dir, config, stage), on_event, began)
