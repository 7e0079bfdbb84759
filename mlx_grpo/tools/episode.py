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

`tool_metrics` turns a step's episode infos into the step metrics that the
tool health rules read (run/health_tools.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np

from ..tasks.data import prompt_messages
from ..tasks.rewarding import RewardFn, reward_name, score_completions
from .calls import STYLES, parse_calls, style_for_template
from .running import DEFAULT_TIMEOUT, run_calls
from .schema import schema_of
from .template import (
    Rendered,
    assistant_message,
    inserted_text,
    render,
    result_messages,
    template_supports_tools,
)

# "misstyled": a final answer that holds a call in another template's style (our parser, reading this
# template's style, saw no call there): the sign of a wrong style, which no tool error would show.
COUNTS = ("calls", "parse", "invalid", "raised", "timeout", "misstyled")
EXAMPLE_CHARS = 160  # how much of an unreadable call the step metrics keep


class ToolEnv:
    """One row's tool episode (see the module docstring)."""

    def __init__(
        self,
        row: dict,
        tools: dict[str, Callable],
        tokenizer,
        rewards: list[RewardFn],
        weights: list[float] | None = None,
        system_prompt: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        style: str | None = None,
    ):
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
        self.turn_calls: list[list[dict]] = []  # each model turn's calls as read, for completions.jsonl
        self.unreadable: str | None = None  # the episode's first call that could not be read
        self._total, self._parts = 0.0, {}
        return Rendered(render(self.tokenizer, self.messages, self.schemas, add_generation_prompt=True))

    def step(self, action: str) -> tuple[str, bool, dict]:
        calls = parse_calls(action, self.style)
        if not calls:  # no call: the final answer
            self.turn_calls.append([])
            if self._other_style_call(action):
                self.counts["misstyled"] += 1
                self.unreadable = self.unreadable or action
            self.answer = action
            self._score(action)
            return Rendered(""), True, self.info()
        results = run_calls(calls, self.tools, self.timeout)
        self.counts["calls"] += len(calls)
        for call, (_, kind) in zip(calls, results):
            if kind:
                self.counts[kind] += 1
            if kind == "parse":
                self.unreadable = self.unreadable or call.text
        # Each call as read and how it went (error kind, None: it ran): inspect shows them under the turn.
        self.turn_calls.append(
            [
                {"name": c.name, "arguments": c.arguments, "error": kind}
                for c, (_, kind) in zip(calls, results)
            ]
        )
        turn = assistant_message(action, calls, self.native)
        new = result_messages(calls, [text for text, _ in results], self.native)
        inserted = inserted_text(self.tokenizer, self.messages + [turn], new, self.schemas)
        self.messages += [turn, *new]
        return Rendered(inserted), False, self.info()

    def _other_style_call(self, text: str) -> bool:
        """Whether `text` holds a named call in a style other than the one this episode reads."""
        return any(call.name for style in STYLES if style != self.style for call in parse_calls(text, style))

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
        info = {
            **{f"tools/{k}": v for k, v in self.counts.items()},
            "tools/answered_without_call": self.answer is not None and self.counts["calls"] == 0,
            "calls": [list(turn) for turn in self.turn_calls],
        }
        if self.unreadable is not None:
            info["tools/unreadable_example"] = self.unreadable[:EXAMPLE_CHARS]
        return info

    def reward(self) -> float:
        return self._total

    def reward_parts(self) -> dict[str, float]:
        return dict(self._parts)


def tool_metrics(infos: list[dict]) -> dict:
    """A step's tool metrics from its episodes' last infos; {} when no episode is a tool episode.

    An episode cut before its environment read a turn has an empty info: it made no call.
    tools/calls_per_episode counts every call the model wrote, read or not (a call in another
    template's style included), and the fractions are of those attempts (None: none was made).
    """
    if not any("tools/calls" in info for info in infos):
        return {}
    count = {k: np.array([info.get(f"tools/{k}", 0) for info in infos], dtype=float) for k in COUNTS}
    attempts = float(count["calls"].sum() + count["misstyled"].sum())
    unreadable = float(count["parse"].sum() + count["misstyled"].sum())
    failed = float(
        (count["invalid"] + count["raised"] + count["timeout"]).sum()
    )  # read, but did not run well
    out = {
        "tools/calls_per_episode": attempts / len(infos),
        "tools/parse_fail_frac": unreadable / attempts if attempts else None,
        "tools/error_frac": failed / attempts if attempts else None,
        "tools/answered_without_call_frac": float(
            np.mean([bool(i.get("tools/answered_without_call")) for i in infos])
        ),
    }
    if any(
        "tools/support_recall" in i for i in infos
    ):  # multihop: an episode cut before reading anything read 0
        out["tools/support_recall"] = float(np.mean([i.get("tools/support_recall", 0.0) for i in infos]))
    example = next((i["tools/unreadable_example"] for i in infos if i.get("tools/unreadable_example")), None)
    if example is not None:
        out["tools/unreadable_example"] = example
    return out
