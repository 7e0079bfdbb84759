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
conversation with and without the new messages and returns the difference; a
template that rewrites earlier turns when a message is added (Qwen3 drops
earlier <think> blocks) is refused with a clear error rather than trained on.
"""

from __future__ import annotations

import json
import re

from .calls import ToolCall

FALLBACK_INSTRUCTIONS = (
    "You can call functions to help answer. Their signatures, one JSON object a line:\n<tools>\n{schemas}\n</tools>\n"
    "To call one, write a JSON object with its name and arguments between tags, one call per block:\n"
    "<tool_call>\n{{\"name\": \"function_name\", \"arguments\": {{\"argument\": \"value\"}}}}\n</tool_call>\n"
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


def render(tokenizer, messages: list[dict], schemas: list[dict], add_generation_prompt: bool) -> str:
    """The conversation as text, through the model's template (tools native or by the fallback)."""
    if template_supports_tools(tokenizer):
        return tokenizer.apply_chat_template(messages, tools=schemas, add_generation_prompt=add_generation_prompt,
                                             tokenize=False)
    return tokenizer.apply_chat_template(_fallback_messages(messages, schemas),
                                         add_generation_prompt=add_generation_prompt, tokenize=False)


def assistant_message(text: str, calls: list[ToolCall], native: bool) -> dict:
    """The model's turn as a message: its calls as structured tool_calls where the template renders them."""
    readable = [c for c in calls if c.error is None and c.name]
    if not native or not readable:
        return {"role": "assistant", "content": text}
    before = text.split("<tool_call>", 1)[0].strip()
    return {"role": "assistant", "content": before,
            "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in readable]}


def result_messages(calls: list[ToolCall], results: list[str], native: bool) -> list[dict]:
    """The tools' results as the messages that follow the model's turn."""
    if native:
        return [{"role": "tool", "name": c.name or "unknown", "content": r} for c, r in zip(calls, results)]
    blocks = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return [{"role": "user", "content": blocks}]


def inserted_text(tokenizer, history: list[dict], new: list[dict], schemas: list[dict]) -> str:
    """What the template writes after `history` when `new` messages follow it, up to the next
    assistant header: the rendering with them, minus the rendering without them."""
    before = render(tokenizer, history, schemas, add_generation_prompt=False)
    after = render(tokenizer, history + new, schemas, add_generation_prompt=True)
    if not after.startswith(before):
        raise ToolTemplateError("the model's chat template rewrites earlier turns when a message is added (as "
                                "Qwen3's drops earlier <think> blocks), so an episode's sampled tokens would not "
                                "be what it is trained on; use a template that keeps earlier turns as they were")
    return after[len(before):]
