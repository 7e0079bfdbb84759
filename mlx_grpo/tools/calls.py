"""Tool calls in a completion: parsing them (three styles) and checking them against the tools' schemas.

Styles, as chat templates teach them:

- hermes (Qwen2.5, Qwen3, Hermes, our fallback): one or more
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks.
- llama3: a bare JSON object `{"name": ..., "parameters": {...}}` (after an
  optional `<|python_tag|>`), several separated by `;` or newlines.
- mistral: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` objects
  (with an "id" in Mistral-Nemo's), or the newer `[TOOL_CALLS]name[ARGS]{...}`
  form (`name[CALL_ID]id[ARGS]{...}` in Mistral-Small-3.2's).

Nothing here raises on what a model wrote: a call that cannot be read becomes
a ToolCall whose `error` says why, and that text goes back to the model as
the tool's result (the episode goes on; the error is counted).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..errors import ConfigError

STYLES = ("hermes", "llama3", "mistral")
_DECODER = json.JSONDecoder()


@dataclass
class ToolCall:
    name: str | None
    arguments: dict = field(default_factory=dict)
    error: str | None = None  # why this call cannot run (a malformed call, an unknown tool, bad arguments)
    text: str = ""  # the span of the completion it was read from
    id: str | None = None  # the id the model gave the call (Mistral's formats carry one), if it wrote one


def style_for_template(template: str | None) -> str:
    """The call style a chat template teaches (hermes when it teaches none: our fallback's).

    A template that teaches calls as `<function=NAME><parameter=...>` XML (Qwen3-Coder's, Qwen3.5's),
    which no style here reads, is a ConfigError (one line from the command): every call would be unreadable.
    """
    template = template or ""
    if "<function=" in template:
        raise ConfigError(
            "the model's chat template teaches tool calls as <function=NAME><parameter=...> XML "
            f"(as Qwen3-Coder's and Qwen3.5's do), which none of the call styles ({', '.join(STYLES)}) "
            "reads; pass --tool-style only if the model writes one of those instead"
        )
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if "<|start_header_id|>" in template and ("parameters" in template or "<|python_tag|>" in template):
        return "llama3"
    return "hermes"


def _call_from_object(obj, text: str, arguments_key: str) -> ToolCall:
    if not isinstance(obj, dict):
        return ToolCall(None, {}, f"a tool call must be a JSON object, got {type(obj).__name__}", text)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, {}, 'the call has no "name"', text)
    arguments = obj.get(arguments_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(name, {}, f"the arguments of {name} are not valid JSON ({e.msg})", text)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCall(name, {}, f"the arguments of {name} must be a JSON object", text)
    call_id = obj.get("id")
    return ToolCall(name, arguments, None, text, call_id if isinstance(call_id, str) else None)


def _json_prefix(text: str):
    """(value, rest) of the JSON value that starts `text`, or raise JSONDecodeError."""
    value, end = _DECODER.raw_decode(text)
    return value, text[end:]


def _hermes(text: str) -> list[ToolCall]:
    calls = []
    for match in re.finditer(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", text, flags=re.S):
        body = match.group(1).strip()
        try:
            value, rest = _json_prefix(body)
        except json.JSONDecodeError as e:
            calls.append(
                ToolCall(
                    None,
                    {},
                    f"the tool call is not valid JSON ({e.msg} at character {e.pos})",
                    match.group(0),
                )
            )
            continue
        call = _call_from_object(value, match.group(0), "arguments")
        if call.error is None and rest.strip():
            call = ToolCall(
                call.name, call.arguments, f"extra text after the JSON of {call.name}", match.group(0)
            )
        calls.append(call)
    return calls


def _llama3(text: str) -> list[ToolCall]:
    body = text.split("<|python_tag|>", 1)[1] if "<|python_tag|>" in text else text
    body = body.strip()
    if not body.startswith("{"):
        return []  # plain prose: an answer, not a call
    calls = []
    while body.startswith("{"):
        try:
            value, rest = _json_prefix(body)
        except json.JSONDecodeError as e:
            calls.append(
                ToolCall(None, {}, f"the tool call is not valid JSON ({e.msg} at character {e.pos})", body)
            )
            break
        calls.append(_call_from_object(value, body[: len(body) - len(rest)], "parameters"))
        body = rest.lstrip().lstrip(";").lstrip()
    return calls


def _mistral(text: str) -> list[ToolCall]:
    if "[TOOL_CALLS]" not in text:
        return []
    calls = []
    for chunk in text.split("[TOOL_CALLS]")[1:]:
        chunk = chunk.strip()
        if "[ARGS]" in chunk and not chunk.startswith("["):  # name[ARGS]{...} or name[CALL_ID]id[ARGS]{...}
            name, args = chunk.split("[ARGS]", 1)
            name, _, call_id = name.partition("[CALL_ID]")
            name, call_id = name.strip(), call_id.strip() or None
            try:
                arguments, _ = _json_prefix(args.strip())
            except json.JSONDecodeError as e:
                calls.append(
                    ToolCall(name, {}, f"the arguments of {name} are not valid JSON ({e.msg})", chunk)
                )
                continue
            calls.append(
                _call_from_object({"name": name, "arguments": arguments, "id": call_id}, chunk, "arguments")
            )
            continue
        try:
            value, _ = _json_prefix(chunk)
        except json.JSONDecodeError as e:
            calls.append(
                ToolCall(None, {}, f"the tool calls are not valid JSON ({e.msg} at character {e.pos})", chunk)
            )
            continue
        for obj in value if isinstance(value, list) else [value]:
            calls.append(_call_from_object(obj, chunk, "arguments"))
    return calls


_PARSERS = {"hermes": _hermes, "llama3": _llama3, "mistral": _mistral}


def parse_calls(text: str, style: str = "hermes") -> list[ToolCall]:
    """The tool calls in a completion, in order; [] when it makes none (a final answer)."""
    if style not in _PARSERS:
        raise ValueError(f"tool-call style {style!r} is not one of {', '.join(STYLES)}")
    return _PARSERS[style](text)


_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def _type_error(value, schema: dict, where: str) -> str | None:
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {json.dumps(schema['enum'])}, got {json.dumps(value)}"
    if "anyOf" in schema:
        if all(_type_error(value, option, where) for option in schema["anyOf"]):
            return f"{where} has the wrong type ({type(value).__name__})"
        return None
    kind = schema.get("type")
    if kind is None:
        return None
    # bool is an int in Python, never in JSON
    wrong = not isinstance(value, _JSON_TYPES[kind]) or (
        kind in ("integer", "number") and isinstance(value, bool)
    )
    if wrong:
        return f"{where} must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, got {json.dumps(value)}"
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            error = _type_error(item, schema["items"], f"{where}[{i}]")
            if error:
                return error
    return None


def check_call(call: ToolCall, schemas: dict[str, dict]) -> ToolCall:
    """`call` with `error` set when it names an unknown tool or its arguments do not fit the schema."""
    if call.error is not None:
        return call
    if call.name not in schemas:
        known = ", ".join(sorted(schemas)) or "none"
        return ToolCall(call.name, call.arguments, f"unknown tool {call.name!r} (tools: {known})", call.text)
    parameters = schemas[call.name]["function"]["parameters"]
    properties = parameters.get("properties", {})
    unknown = [k for k in call.arguments if k not in properties]
    if unknown:
        return ToolCall(
            call.name,
            call.arguments,
            f"{call.name} has no argument {unknown[0]!r} (arguments: {', '.join(properties) or 'none'})",
            call.text,
        )
    missing = [k for k in parameters.get("required", []) if k not in call.arguments]
    if missing:
        return ToolCall(
            call.name, call.arguments, f"{call.name} needs the argument {missing[0]!r}", call.text
        )
    for key, value in call.arguments.items():
        error = _type_error(value, properties[key], f"{call.name}: argument {key!r}")
        if error:
            return ToolCall(call.name, call.arguments, error, call.text)
    return call
