"""The task's reward functions (fn(prompts, completions, **columns)) and its accuracy."""

from __future__ import annotations

from .grading import TRAINING, GradeConfig
from .pool import grades_for


def make_reward(config: GradeConfig, name: str = "ocaml_reward"):
    """A reward function grading with ``config`` (e.g. other stage weights), for --reward-file."""

    def reward(prompts, completions, signature, tests, preamble=None, finish_reason=None, **kwargs):
        return [g.score for g in grades_for(completions, signature, tests, preamble, finish_reason, config)]

    reward.__name__ = name
    return reward


ocaml_reward = make_reward(TRAINING)
ocaml_reward.__doc__ = "The staged OCaml score (0-1), times 0.3 for degenerate repetitive output."


def ocaml_passes(prompts, completions, signature, tests, preamble=None, **kwargs) -> list[float]:
    """1.0 when every test passes (no penalty), else 0.0: the task's accuracy."""
    return [
        1.0 if g.stage == "passed" else 0.0
        for g in grades_for(completions, signature, tests, preamble, None, TRAINING)
    ]


def ocaml_compiles(prompts, completions, signature, tests, preamble=None, finish_reason=None, **kwargs):
    """Logged only (weight 0): 1.0 when the code builds with the tests."""
    return [
        1.0 if g.stage in ("constant", "tests", "passed") else 0.0
        for g in grades_for(completions, signature, tests, preamble, finish_reason, TRAINING)
    ]


def ocaml_runaway(prompts, completions, signature, tests, preamble=None, finish_reason=None, **kwargs):
    """Logged only (weight 0): 1.0 when the runaway penalty applied."""
    return [
        1.0 if g.runaway else 0.0
        for g in grades_for(completions, signature, tests, preamble, finish_reason, TRAINING)
    ]


def ocaml_constant(prompts, completions, signature, tests, preamble=None, finish_reason=None, **kwargs):
    """Logged only (weight 0): 1.0 when the code builds but returns a constant (no credit: grading.py)."""
    return [
        1.0 if g.stage == "constant" else 0.0
        for g in grades_for(completions, signature, tests, preamble, finish_reason, TRAINING)
    ]


def answer_stages(prompts, completions, signature, tests, preamble=None, **kwargs) -> list[str]:
    """The grading stage each completion reached (grading.STAGES): compare's report counts answers by it."""
    return [g.stage for g in grades_for(completions, signature, tests, preamble, None, TRAINING)]


accuracy_reward = ocaml_passes

# The weight-0 rewards put the pass, compile and runaway rates into the metrics
# (reward/ocaml_passes/mean, ...) without changing the reward. A recipe may weight
# them otherwise by name (`reward:` and `reward_weights:`, as configs/ocaml.yaml does).
REWARDS = [
    (ocaml_reward, 1.0),
    (ocaml_compiles, 0.0),
    (ocaml_runaway, 0.0),
    (ocaml_constant, 0.0),
    (ocaml_passes, 0.0),
]
