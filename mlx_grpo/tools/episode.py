"""A tool-calling episode as an environment: the model calls tools until it answers.

    prompt (tools in the model's template) -> model turn -> its calls parsed and run
    -> results inserted as the template writes them -> model turn -> ... -> an answer

A turn with no call is the final answer: the episode ends and the task's reward
functions score it. Everything a turn's calls go through (a call that cannot be
read, an unknown tool, bad arguments, a tool that raises or hangs) becomes the
tool's result text for the model to read, and is counted in `info`; nothing
ends the episode early but `max_turns` and the token budget (multiturn.py).

The results come back as `Rendered` text, so the rollout inserts exactly what
the template writes between turns (template.py) and masks all of it: only the
model's own tokens are trained. `--tools FILE.py` makes every row of a task
such an episode (tasks/registry.py); the rollout binds the tokenizer.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

from ..tasks.data import prompt_messages
from ..tasks.rewarding import RewardFn, reward_name, score_completions
from .calls import parse_calls, style_for_template
from .running import DEFAULT_TIMEOUT, run_calls
from .schema import schema_of
from .template import Rendered, assistant_message, inserted_text, render, result_messages, template_supports_tools

COUNTS = ("calls", "parse", "invalid", "raised", "timeout")


class ToolEnv:
    """One row's tool episode (see the module docstring)."""

    def __init__(self, row: dict, tools: dict[str, Callable], tokenizer, rewards: list[RewardFn],
                 weights: list[float] | None = None, system_prompt: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, style: str | None = None):
        self.row, self.tools = row, tools
        self.rewards, self.weights = rewards, weights or [1.0] * len(rewards)
        self.system_prompt, self.timeout, self.chosen_style = system_prompt, timeout, style
        self.schemas = [schema_of(fn) for fn in tools.values()]
        if tokenizer is not None:
            self.bind(tokenizer)

    def bind(self, tokenizer) -> None:
        """The model's tokenizer, which the rollout hands over when a task made the environment."""
        self.tokenizer = tokenizer
        self.native = template_supports_tools(tokenizer)
        self.style = self.chosen_style or style_for_template(getattr(tokenizer, "chat_template", None))

    def reset(self) -> str:
        self.messages = prompt_messages(self.row["prompt"], self.system_prompt)
        self.counts = Counter({k: 0 for k in COUNTS})
        self.answer: str | None = None
        self._total, self._parts = 0.0, {}
        return Rendered(render(self.tokenizer, self.messages, self.schemas, add_generation_prompt=True))

    def step(self, action: str) -> tuple[str, bool, dict]:
        calls = parse_calls(action, self.style)
        if not calls:  # no call: the final answer
            self.answer = action
            self._score(action)
            return Rendered(""), True, self.info()
        results = run_calls(calls, self.tools, self.timeout)
        self.counts["calls"] += len(calls)
        for _, kind in results:
            if kind:
                self.counts[kind] += 1
        turn = assistant_message(action, calls, self.native)
        new = result_messages(calls, [text for text, _ in results], self.native)
        inserted = inserted_text(self.tokenizer, self.messages + [turn], new, self.schemas)
        self.messages += [turn, *new]
        return Rendered(inserted), False, self.info()

    def columns(self) -> dict[str, list]:
        """The reward functions' columns: the row's own (a task's environment may add its episode's)."""
        return {k: [v] for k, v in self.row.items() if k != "prompt"}

    def _score(self, answer: str) -> None:
        columns = self.columns()
        prompt = self.row["prompt"] if isinstance(self.row["prompt"], str) else str(self.row["prompt"])
        scores = score_completions(self.rewards, self.weights, [prompt], [answer], columns)
        self._parts = {reward_name(f): scores.parts[reward_name(f)][0] or 0.0 for f in self.rewards}
        self._total = float(scores.total[0])

    def info(self) -> dict:
        return {**{f"tools/{k}": v for k, v in self.counts.items()},
                "tools/answered_without_call": self.answer is not None and self.counts["calls"] == 0}

    def reward(self) -> float:
        return self._total

    def reward_parts(self) -> dict[str, float]:
        return dict(self._parts)
