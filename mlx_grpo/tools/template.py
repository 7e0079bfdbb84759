"""Tools through the model's own chat template, or a documented fallback for templates without them.

A template that knows tools (Qwen2.5, Qwen3, Llama 3.x) renders the schemas from
`apply_chat_template(messages, tools=...)`, the model's calls from an assistant
message's `tool_calls` (arguments as a dict: templates that apply `tojson`
would otherwise encode a JSON string twice) and the results from `tool`
messages. A template that does not (SmolLM2's, the embedded models') gets the
fallback: the schemas in the system prompt, Hermes-style (`<tool_call>` JSON,
which `parse_calls(..., "hermes")` reads), and the results as a user turn of
`<tool_response>` blocks.

Only what is inserted between the model's turns is ever tokenized here: the
sampled ids of the model's own turns are kept as they were sampled (re-tokenizing
an episode makes training silently off-policy). `inserted_text` renders the
conversation with and without the new messages and returns the difference. A
template that drops the reasoning of the model's last turn once a message
follows it (Qwen3 writes an empty <think> block only into the last turn, QwQ
drops every earlier turn's) is handled: the difference is taken from where that
turn ends, and the episode keeps the reasoning as sampled. A template that
rewrites earlier turns in any other way is refused with a clear error rather
than trained on.

Calls carry ids (the model's own where it wrote one, else made from the call),
which Mistral's templates require; a template that takes one call per message
(Llama 3.x's) gets a turn's calls as consecutive assistant messages.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from jinja2 import TemplateError

from .calls import ToolCall

FALLBACK_INSTRUCTIONS = (
    "You can call functions to help answer. Their signatures, one JSON object a "
    "line:\n<tools>\n{schemas}\n</tools>\n"
    "To call one, write a JSON object with its name and arguments between tags, one call per block:\n"
    '<tool_call>\n{{"name": "function_name", "arguments": {{"argument": "value"}}}}\n</tool_call>\n'
    "The results come back as <tool_response> blocks. When you know the answer, give it without a call."
)


class Rendered(str):
    """An observation written as the chat template writes it, headers included.

    From an environment's `reset`: the whole first prompt. From `step`: everything
    after the model's end-of-turn up to the next assistant header (a tool episode's
    results). The multi-turn rollout tokenizes it as it is instead of wrapping it
    in a user turn.
    """


class ToolTemplateError(ValueError):
    """A chat template that cannot carry tool episodes as trained, said in one line."""


def template_supports_tools(tokenizer) -> bool:
    """Whether the model's own template renders tools (it reads a `tools` variable)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return bool(re.search(r"\btools\b", template))


def _fallback_messages(messages: list[dict], schemas: list[dict]) -> list[dict]:
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    instructions = FALLBACK_INSTRUCTIONS.format(schemas=lines)
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{instructions}"}, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]


def _one_call_per_message(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        calls = m.get("tool_calls") or []
        if len(calls) < 2:
            out.append(m)
            continue
        out.append({**m, "tool_calls": calls[:1]})
        out += [{"role": "assistant", "content": "", "tool_calls": [c]} for c in calls[1:]]
    return out


def render(tokenizer, messages: list[dict], schemas: list[dict], add_generation_prompt: bool) -> str:
    """The conversation as text, through the model's template (tools native or by the fallback).

    A template that refuses a message with several calls (Llama 3.x's: "This model only supports
    single tool-calls at once!") gets them one a message; any other refusal is a ToolTemplateError.
    """
    native = template_supports_tools(tokenizer)
    kwargs = {"tools": schemas} if native else {}
    if not native:
        messages = _fallback_messages(messages, schemas)
    try:
        try:
            return tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
            )
        except TemplateError:
            split = _one_call_per_message(messages)
            if split == messages:
                raise
            return tokenizer.apply_chat_template(
                split, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
            )
    except TemplateError as e:  # the template's own words, on one line
        raise ToolTemplateError(
            "the model's chat template cannot render this tool conversation: " + " ".join(str(e).split())
        ) from None


def call_id(call: ToolCall, index: int) -> str:
    """The id that pairs a call with its result (Mistral's templates require 9 letters or digits):
    the model's own when it wrote one of that form, else one made from the call and its place in the turn."""
    if call.id and re.fullmatch(r"[A-Za-z0-9]{9}", call.id):
        return call.id
    key = json.dumps([index, call.name, call.arguments], sort_keys=True, default=str)
    return hashlib.sha1(key.encode()).hexdigest()[:9]


CALL_MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")


def assistant_message(text: str, calls: list[ToolCall], native: bool) -> dict:
    """The model's turn as a message: its calls as structured tool_calls where the template renders them,
    and as its content the text before the first call (the template writes the calls after it)."""
    readable = [(i, c) for i, c in enumerate(calls) if c.error is None and c.name]
    if not native or not readable:
        return {"role": "assistant", "content": text}
    cut = min((text.find(m) for m in CALL_MARKERS if m in text), default=-1)
    if cut < 0:  # llama3's bare JSON: the call is where its text is
        cut = max(text.find(calls[0].text), 0) if calls[0].text else len(text)
    return {
        "role": "assistant",
        "content": text[:cut].strip(),
        "tool_calls": [
            {"type": "function", "id": call_id(c, i), "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in readable
        ],
    }


def result_messages(calls: list[ToolCall], results: list[str], native: bool) -> list[dict]:
    """The tools' results as the messages that follow the model's turn."""
    if native:
        return [
            {"role": "tool", "name": c.name or "unknown", "tool_call_id": call_id(c, i), "content": r}
            for i, (c, r) in enumerate(zip(calls, results))
        ]
    blocks = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return [{"role": "user", "content": blocks}]


def _end_without_reasoning(before: str, after: str, start: int) -> int | None:
    """Where the last turn of `before` ends in `after`, when `after` writes that turn (from `start` on) with
    its reasoning taken out: before = P + D + K and after = P + K + ..., where D ends with </think> (and
    the blank after it) and K, the rest of the turn (its text, its calls, its end), is written as it was.
    None when the turn was rewritten in any other way."""
    common = len(os.path.commonprefix([before, after]))
    for close in re.finditer(r"</think>(\s*)", before[start:]):
        for cut in range(
            start + close.end(), start + close.start(1) - 1, -1
        ):  # the blank after it kept or not
            kept = before[cut:]
            for at in range(min(common, start + close.start()), start - 1, -1):
                if kept and after.startswith(kept, at):
                    return at + len(kept)
    return None


def inserted_text(tokenizer, history: list[dict], new: list[dict], schemas: list[dict]) -> str:
    """What the template writes after `history` when `new` messages follow it, up to the next
    assistant header: the rendering with them, minus the rendering without them.

    `history` ends with the model's turn. A template that drops that turn's reasoning once a message
    follows it (Qwen3, QwQ) is handled: the difference starts where the turn ends in both."""
    before = render(tokenizer, history, schemas, add_generation_prompt=False)
    after = render(tokenizer, history + new, schemas, add_generation_prompt=True)
    if after.startswith(before):
        return after[len(before) :]
    earlier = render(tokenizer, history[:-1], schemas, add_generation_prompt=False)
    if before.startswith(earlier) and after.startswith(earlier):
        end = _end_without_reasoning(before, after, len(earlier))
        if end is not None:
            return after[end:]
    raise ToolTemplateError(
        "the model's chat template rewrites earlier turns when a message is added (beyond "
        "dropping the last turn's <think> block), so an episode's sampled tokens would not be "
        "what it is trained on; use a template that keeps earlier turns as they were"
    )
