"""A scripted tool episode played through mlx_grpo.tools.template, for checking a chat template.

Each model turn is what the template itself writes for it (so the parse style
must read it back), then goes through the episode's own path: parse_calls,
assistant_message, result_messages, inserted_text. `play` records, turn by
turn, what was inserted and whether the template kept the conversation a
prefix (`prefix` False: inserted_text took the reasoning-dropping path).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from mlx_grpo.tools import ToolCall, parse_calls, schema_of
from mlx_grpo.tools.template import assistant_message, inserted_text, render, result_messages

THINK = "<think>\nFirst the notes, then the page.\n</think>\n\n"


def search(query: str) -> str:
    """Search the notes.

    Args:
        query: words to look for
    """
    return query


def lookup(title: str, limit: int = 3) -> str:
    """Read a page.

    Args:
        title: the page's title
        limit: how many paragraphs
    """
    return title


SCHEMAS = [schema_of(search), schema_of(lookup)]

# Several turns; one call, then several a turn; a turn with content before its calls.
TURNS = [
    ("Let me look.", [("search", {"query": "Oslo"})]),
    ("", [("search", {"query": "Norway capital"}), ("lookup", {"title": "Oslo", "limit": 2})]),
    ("One more check.", [("lookup", {"title": "Norway"}), ("search", {"query": "fjords"})]),
]


@dataclass
class Step:
    text: str  # the model's turn as written
    calls: list[ToolCall]  # as parse_calls read them back
    rendered: str  # the template's rendering of the turn, from where the generation prompt ends
    inserted: str
    prefix: bool  # the rendering with the new messages began with the rendering without them


def _turn_text(
    tokenizer, history: list[dict], content: str, calls: list[ToolCall], style: str
) -> tuple[str, str]:
    """(what the model writes for this turn, the template's rendering of it)."""
    head = render(tokenizer, history, SCHEMAS, add_generation_prompt=True)
    full = render(
        tokenizer,
        history + [assistant_message(content, calls, native=True)],
        SCHEMAS,
        add_generation_prompt=False,
    )
    common = os.path.commonprefix([head, full])
    if (
        common != head
    ):  # the turn parts from the generation prompt (QwQ's closes a <think> block): back to a line
        common = common[: max(common.rfind("\n"), common.rfind(">"), common.rfind("]")) + 1]
    rendered = full[len(common) :]
    if (
        style == "llama3" and len(calls) > 1
    ):  # Llama's template shows one call a message; the model joins them
        return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}) for c in calls), rendered
    return rendered, rendered


def play(tokenizer, style: str, think: bool = False, turns=TURNS) -> tuple[str, list[Step]]:
    """(the first prompt, each turn's Step); `think` starts every turn's content with a <think> block."""
    history = [{"role": "user", "content": "Which city is the capital of Norway?"}]
    prompt = render(tokenizer, history, SCHEMAS, add_generation_prompt=True)
    steps = []
    for t, (content, wanted) in enumerate(turns):
        calls = [ToolCall(name, arguments) for name, arguments in wanted]
        text, rendered = _turn_text(tokenizer, history, (THINK if think else "") + content, calls, style)
        read = parse_calls(text, style)
        turn = assistant_message(text, read, native=True)
        results = [f"result {t}.{i} of {c.name}" for i, c in enumerate(read)]
        new = result_messages(read, results, native=True)
        inserted = inserted_text(tokenizer, history + [turn], new, SCHEMAS)
        before = render(tokenizer, history + [turn], SCHEMAS, add_generation_prompt=False)
        after = render(tokenizer, history + [turn] + new, SCHEMAS, add_generation_prompt=True)
        closed = render(tokenizer, history + [turn] + new, SCHEMAS, add_generation_prompt=False)
        if after.startswith(closed):  # it ends where the model starts writing: the generation prompt
            assert inserted.endswith(after[len(closed) :])
        steps.append(Step(text, read, rendered, inserted, after.startswith(before)))
        history += [turn, *new]
    return prompt, steps


def check_episode(tokenizer, style: str, think: bool = False) -> list[Step]:
    """Play TURNS and check what every inserted text must be; returns the steps for more checks."""
    prompt, steps = play(tokenizer, style, think)
    assert all(s["function"]["name"] in prompt for s in SCHEMAS), "the tools' schemas are in the first prompt"
    for t, (step, (_, wanted)) in enumerate(zip(steps, TURNS)):
        # The parse style reads back what the template wrote (or, for llama3, what the model joins).
        assert [(c.name, c.arguments, c.error) for c in step.calls] == [(n, a, None) for n, a in wanted]
        # Arguments went in as a dict and are written once as JSON, never as an encoded string.
        for _, arguments in wanted:
            assert json.dumps(arguments) in step.rendered
            assert json.dumps(json.dumps(arguments))[1:-1] not in step.rendered
        # Every result, in order, and nothing of the model's turn, is in what was inserted.
        positions = [step.inserted.find(f"result {t}.{i} of {name}") for i, (name, _) in enumerate(wanted)]
        assert -1 not in positions and positions == sorted(positions), step.inserted
        assert not any(json.dumps(arguments) in step.inserted for _, arguments in wanted), step.inserted
    return steps
