"""The environment protocol: what a multi-turn task gives the trainer.

    observation = env.reset()                      the first observation (text)
    observation, done, info = env.step(action)     the model's turn, as text
    env.reward() -> float                          the episode's reward, once done
    env.reward_parts() -> dict[str, float]         its named parts, logged separately

`step` must accept any text (a model writes anything) and should never
raise: a malformed action is an observation that says so. `reset` must be
deterministic for a given task, since the G episodes of a group share their
first prompt.

A single-turn task is the one-step case: `SingleTurnEnv` shows its prompt,
takes one completion and scores it with the task's reward functions.
A task module offers environments by defining `make_env(row) -> Environment`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..tasks.rewarding import RewardFn, reward_name, score_completions
from ..tools.template import Rendered  # noqa: F401 (environments return it; public here)


@runtime_checkable
class Environment(Protocol):
    def reset(self) -> str: ...

    def step(self, action: str) -> tuple[str, bool, dict]: ...

    def reward(self) -> float: ...

    def reward_parts(self) -> dict[str, float]: ...


class SingleTurnEnv:
    """A prompt and its reward functions as a one-step environment."""

    def __init__(self, row: dict, functions: list[RewardFn], weights: list[float] | None = None):
        self.row = row
        self.functions = functions
        self.weights = weights or [1.0] * len(functions)
        self.reset()

    def reset(self) -> str:
        self._parts: dict[str, float] = {}
        self._total = 0.0
        self.done = False
        return self.row["prompt"]

    def step(self, action: str) -> tuple[str, bool, dict]:
        if not self.done:
            columns = {k: [v] for k, v in self.row.items() if k != "prompt"}
            scores = score_completions(self.functions, self.weights, [self.row["prompt"]], [action], columns)
            # Not applicable (None) counts as 0 here: an episode's parts are plain numbers.
            self._parts = {reward_name(f): scores.parts[reward_name(f)][0] or 0.0 for f in self.functions}
            self._total = float(scores.total[0])
            self.done = True
        return "", True, {"reward": self._total, "reward_parts": dict(self._parts)}

    def reward(self) -> float:
        return self._total

    def reward_parts(self) -> dict[str, float]:
        return dict(self._parts)
