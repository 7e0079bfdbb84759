"""How a measuring script hands over its result: one JSON object on stdout (so a pipe or a test reads stdout
as JSON alone), the same text in the file its --out or --json names, and a table for people on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def emit_result(result: dict, path: str | None, table: str, indent: int = 2) -> None:
    """Write `result` as JSON to `path` (when given) and to stdout, then `table` to stderr."""
    text = json.dumps(result, indent=indent)
    if path:
        Path(path).write_text(text + "\n")
    print(text)
    print(table, file=sys.stderr)
