"""Tool calling: tools are plain Python functions (schema.py), calls are parsed from completions
(calls.py) and run with a time limit (running.py), and the conversation goes through the model's own
chat template or a documented fallback (template.py)."""

from .calls import STYLES, ToolCall, check_call, parse_calls, style_for_template
from .running import DEFAULT_TIMEOUT, ToolsFileError, load_tools, result_text, run_calls, schemas_of
from .schema import ToolSchemaError, docstring_parts, schema_of
from .template import (
    ToolTemplateError,
    assistant_message,
    inserted_text,
    render,
    result_messages,
    template_supports_tools,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "STYLES",
    "ToolCall",
    "ToolSchemaError",
    "ToolTemplateError",
    "ToolsFileError",
    "assistant_message",
    "check_call",
    "docstring_parts",
    "inserted_text",
    "load_tools",
    "parse_calls",
    "render",
    "result_messages",
    "result_text",
    "run_calls",
    "schema_of",
    "schemas_of",
    "style_for_template",
    "template_supports_tools",
]
