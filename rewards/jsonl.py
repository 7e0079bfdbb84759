"""Reading a task's own JSONL file: every task names a bad line the same way, "PATH:LINE"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def jsonl_records(path: str | Path) -> Iterator[tuple[str, object]]:
    """("PATH:LINE", record) for each non-blank line; ValueError names the first malformed line."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: malformed JSON ({e.msg})") from None
            yield f"{path}:{number}", record
