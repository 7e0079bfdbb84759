"""A Python function as a tool: the JSON schema chat templates expect, from its signature and docstring.

The schema is OpenAI's function format, the one Qwen2.5, Qwen3 and Llama 3.x
templates render from `apply_chat_template(messages, tools=[...])`:

    {"type": "function", "function": {"name": ..., "description": ...,
     "parameters": {"type": "object", "properties": {...}, "required": [...]}}}

Types come from the annotations (str, int, float, bool, list[...], dict,
Literal[...], Optional[...] / X | None); an argument's description comes from
the docstring's "Args:" section (Google style) or ":param name:" lines. An
argument without a default is required.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any, Callable, Literal, Union

_SIMPLE = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
    type(None): "null",
}


class ToolSchemaError(ValueError):
    """A tool function whose schema cannot be written (an annotation with no JSON type), in one line."""


def json_type(annotation, where: str) -> dict:
    """The JSON schema of one annotation."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}  # unannotated: any JSON value
    if annotation in _SIMPLE:
        return {"type": _SIMPLE[annotation]}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        kinds = {_SIMPLE.get(type(a)) for a in args}
        schema = {"enum": list(args)}
        if len(kinds) == 1 and None not in kinds:
            schema["type"] = kinds.pop()
        return schema
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # Optional[X]: X, or nothing
            return json_type(options[0], where)
        return {"anyOf": [json_type(a, where) for a in options]}
    if origin in (list, tuple, set, frozenset):
        schema = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = json_type(args[0], where)
        return schema
    if origin is dict:
        return {"type": "object"}
    raise ToolSchemaError(
        f"{where}: annotation {annotation!r} has no JSON type "
        "(use str, int, float, bool, list[...], dict, Literal[...] or Optional[...])"
    )


def docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) from a Google-style or :param: docstring."""
    doc = inspect.cleandoc(doc or "")
    described: dict[str, str] = {}
    for name, text in re.findall(r"^:param\s+(?:\w+\s+)?(\w+):\s*(.+)$", doc, flags=re.M):
        described[name] = text.strip()
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?|\s*\n)+)", doc, flags=re.M)
    if section:
        current = None
        for line in section.group(1).splitlines():
            entry = re.match(r"^\s{1,8}(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if entry:
                current = entry.group(1)
                described[current] = entry.group(2).strip()
            elif current and line.strip():
                described[current] = f"{described[current]} {line.strip()}".strip()
    head = re.split(
        r"\n\s*\n|^(?:Args|Arguments|Parameters|Returns|Raises):|^:param", doc, maxsplit=1, flags=re.M
    )[0]
    return " ".join(head.split()), described


def schema_of(fn: Callable) -> dict:
    """The OpenAI-format function schema of `fn` (see the module docstring)."""
    name = getattr(fn, "__name__", None)
    if not name or not callable(fn):
        raise ToolSchemaError(f"{fn!r} is not a named function")
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - a forward reference that does not resolve: fall back to the raw ones
        hints = {}
    description, described = docstring_parts(fn.__doc__)
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue  # *args / **kwargs: nothing a model can name
        schema = json_type(hints.get(p.name, p.annotation), f"tool {name}, argument {p.name}")
        if p.name in described:
            schema["description"] = described[p.name]
        properties[p.name] = schema
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }
