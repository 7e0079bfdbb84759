"""Tool calling: tools are plain Python functions (schema.py), calls are parsed from completions
(calls.py) and run with a time limit (running.py)."""

from .calls import STYLES, ToolCall, check_call, parse_calls, style_for_template
from .running import DEFAULT_TIMEOUT, ToolsFileError, load_tools, result_text, run_calls, schemas_of
from .schema import ToolSchemaError, docstring_parts, schema_of

__all__ = ["DEFAULT_TIMEOUT", "STYLES", "ToolCall", "ToolSchemaError", "ToolsFileError", "check_call",
           "docstring_parts", "load_tools", "parse_calls", "result_text", "run_calls", "schema_of", "schemas_of",
           "style_for_template"]
