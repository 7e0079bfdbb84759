"""What counts as right: the one place that judges an answer, for every evaluation.

A single-turn answer is judged by its task's accuracy reward (None, "not applicable",
counts as 0): the answer is *right* when the value is at least RIGHT. Every accuracy
reported is the share of answers that are right (a reward with partial credit, 0.3 and
0.8, gives 0.5, not 0.55): the before/after check, `eval`, `compare`, pass@k,
--prefilter's pass rates, --guide's all-wrong groups. An episode of a multi-turn task
is judged by its environment: *solved* when its info says so, else when its reward is
at least 1, and never when the environment failed.

The before/after accuracy (sampling/heldout.py), multi-turn evaluation
(sampling/multiturn.py), `eval` and `compare` (evaluation/compare.py), --prefilter
(run/prefilter.py), --guide (run/guidance.py) and the curriculum's success rates
(curriculum.py) all ask here.
"""

from __future__ import annotations

import numpy as np

from .data import columns_of
from .rewarding import Scores, reward_name, score_completions

RIGHT = 0.5  # an answer is right at this accuracy reward or above


def accuracy_of(values) -> np.ndarray:
    """Each answer's accuracy from its accuracy reward: None (not applicable) counts as 0."""
    return np.array([v if v is not None else 0.0 for v in values], dtype=float)


def right(values) -> np.ndarray:
    """Which answers are right: accuracy reward at least RIGHT (None is wrong)."""
    return accuracy_of(values) >= RIGHT


def solved(episode) -> bool:
    """An episode is solved when its environment's info says so, else when its reward is at least 1;
    never when the environment failed."""
    return bool(episode.info.get("solved", episode.reward >= 1.0)) and not episode.error


def accuracy_values(task, rows: list[dict], k: int, answers: list, scores: Scores | None = None) -> list:
    """The task's accuracy reward of each answer (k a row, grouped by row; None: not applicable).

    When `scores` holds the task's rewards and the accuracy reward is one of them, its values
    are taken from there rather than computed twice (an OCaml reward compiles code)."""
    name = reward_name(task.accuracy_reward)
    if (
        scores is not None
        and name in [reward_name(f) for f in task.reward_functions]
        and name in scores.parts
    ):
        return scores.parts[name]
    return score_completions(
        [task.accuracy_reward],
        [1.0],
        [r["prompt"] for r in rows for _ in range(k)],
        [a.text for a in answers],
        columns_of(rows, k, answers),
    ).parts[name]
