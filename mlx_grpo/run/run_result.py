"""What a run ends with (RunResult: the accuracies and the summary line) and the held-out checks that measure
them, shared by `train` (trainer.py), `sft` (sft.py) and the warm start between them (warm_start.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import TrainConfig
from ..sampling.kinds import rollouts_for
from ..tasks.registry import Task
from .step_rollouts import rollout_settings


@dataclass
class RunResult:
    run_dir: Path
    accuracy_before: float | None
    accuracy_after: float | None
    eval_n: int
    history: list[dict] = field(default_factory=list)
    accuracy_after_warm_start: float | None = None  # GRPO's starting accuracy when a warm start ran first

    def summary_line(self) -> str:
        if self.accuracy_after is None:
            return f"run saved to {self.run_dir}"
        if (
            self.accuracy_before is None
        ):  # not checked (eval_before: false): the gain is from the warm start's check
            start = self.accuracy_after_warm_start
            if start is None:
                return (
                    f"accuracy not checked before -> {self.accuracy_after:.2f} "
                    f"on {self.eval_n} held-out problems"
                )
            return (
                f"accuracy not checked before -> {start:.2f} after the warm start -> "
                f"{self.accuracy_after:.2f} "
                f"({self.accuracy_after - start:+.2f}) on {self.eval_n} held-out problems"
            )
        gain = self.accuracy_after - self.accuracy_before
        middle = (
            ""
            if self.accuracy_after_warm_start is None
            else f" -> {self.accuracy_after_warm_start:.2f} after the warm start"
        )
        return (
            f"accuracy {self.accuracy_before:.2f}{middle} -> {self.accuracy_after:.2f} "
            f"({gain:+.2f}) on {self.eval_n} held-out problems"
        )


def evaluate(model, tokenizer, task: Task, config: TrainConfig) -> dict:
    """Held-out accuracy: greedy completions, or greedy episodes for a multi-turn task."""
    return rollouts_for(task).evaluate(model, tokenizer, rollout_settings(config))


def check_before(model, tokenizer, task: Task, config: TrainConfig) -> dict:
    """The held-out check before a run's first step: measured now, or, under eval_before: false, not checked
    (accuracy None, no seconds: train's time limit then reserves nothing for the final check until a check
    every eval_steps is timed)."""
    if config.eval_before:
        return evaluate(model, tokenizer, task, config)
    return {"accuracy": None, "n": 0, "seconds": 0.0, "not_checked": True}
