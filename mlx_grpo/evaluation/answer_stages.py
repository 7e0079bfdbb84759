"""How far each answer got on a task's grading ladder, for compare's and eval's report.

A built-in task that grades in stages (ocaml: syntax_error, type_error,
compile_error, constant, tests, passed) defines `answer_stages(prompts,
completions, **columns) -> list[str]`, the stage each completion reached, and
`STAGES`, its ladder from the bottom. The report then shows, per model, the
share of answers that stopped at each stage: what a recipe has taught shows as
answers moving up the ladder before they pass. The OCaml grades are the ones
its rewards just computed (remembered by rewards/ocaml/pool.py), not new ones.
"""

from __future__ import annotations

import importlib
from typing import Callable

from ..sampling.kinds import rollouts_for
from ..tasks.data import columns_of
from ..tasks.registry import BUILTIN_TASKS, Task


def _task_module(task: Task):
    name = BUILTIN_TASKS.get(task.name)
    return importlib.import_module(name) if name else None


def stage_function(task: Task) -> Callable | None:
    """The task's answer_stages, for single completions; None for a task without one, and for episodes
    (their text is a transcript, not one answer to grade)."""
    if rollouts_for(task).plays_episodes:
        return None
    return getattr(_task_module(task), "answer_stages", None)


def answer_stages(task: Task, rows: list[dict], answers: list, samples: int) -> list[str] | None:
    """The stage each of the rows' answers (samples a row, grouped by row) reached; None without a ladder."""
    stages_of = stage_function(task)
    if stages_of is None:
        return None
    prompts = [r["prompt"] for r in rows for _ in range(samples)]
    return list(stages_of(prompts, [a.text for a in answers], **columns_of(rows, samples, answers)))


def stage_shares(task: Task, stages: list[str]) -> dict[str, float]:
    """The share of answers that stopped at each stage of the ladder, bottom first (every stage, so that
    two models' shares line up)."""
    ladder = list(getattr(_task_module(task), "STAGES", ()))
    names = ladder + sorted(set(stages) - set(ladder))
    return {stage: stages.count(stage) / len(stages) for stage in names}
