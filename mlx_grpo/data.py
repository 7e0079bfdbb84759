"""Prompt datasets: local JSONL/JSON/Parquet files, folders, or HF datasets.

A row is a dict with a "prompt" (text, or a list of chat messages) and any
other columns (e.g. "answer"), which are passed to the reward functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SPLIT_FILES = {"train": ("train",), "test": ("test", "valid", "validation")}


class DataError(ValueError):
    """A data problem the user can fix; the message says where."""


@dataclass
class LoadReport:
    rows: int = 0
    skipped: int = 0
    skipped_lines: list = field(default_factory=list)  # first few (line number, reason)

    def skip(self, line: int, reason: str):
        self.skipped += 1
        if len(self.skipped_lines) < 5:
            self.skipped_lines.append((line, reason))

    def summary(self, source: str) -> str | None:
        if not self.skipped:
            return None
        where = "; ".join(f"line {n}: {why}" for n, why in self.skipped_lines)
        return f"{source}: skipped {self.skipped} bad row(s) of {self.rows + self.skipped} ({where})"


def _valid_prompt(prompt) -> bool:
    if isinstance(prompt, str):
        return bool(prompt.strip())
    if isinstance(prompt, list) and prompt:
        return all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    return False


def read_jsonl(path: Path, report: LoadReport, prompt_key: str = "prompt") -> list[dict]:
    rows = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                report.skip(number, "not UTF-8")
                continue
            except json.JSONDecodeError as e:
                report.skip(number, f"malformed JSON ({e.msg})")
                continue
            if not isinstance(row, dict):
                report.skip(number, "not a JSON object")
            elif prompt_key not in row:
                report.skip(number, f"no {prompt_key!r} column")
            elif not _valid_prompt(row[prompt_key]):
                report.skip(number, "empty or malformed prompt")
            else:
                rows.append(row)
    report.rows = len(rows)
    return rows


def _read_file(path: Path, report: LoadReport) -> list[dict]:
    if path.suffix == ".parquet":
        import datasets

        return [dict(r) for r in datasets.Dataset.from_parquet(str(path))]
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of rows")
        rows = []
        for number, row in enumerate(data, start=1):
            if isinstance(row, dict) and _valid_prompt(row.get("prompt")):
                rows.append(row)
            else:
                report.skip(number, "row without a valid prompt")
        report.rows = len(rows)
        return rows
    return read_jsonl(path, report)


def load_rows(spec: str, split: str) -> tuple[list[dict], str | None]:
    """Rows of `split` ("train" or "test") and a warning about skipped rows, if any.

    spec: a file (its rows are the train split; there is no test split), a
    folder holding train.jsonl and test.jsonl/valid.jsonl, or a Hugging Face
    dataset name.
    """
    path = Path(spec).expanduser()
    report = LoadReport()
    if path.is_file():
        rows = _read_file(path, report) if split == "train" else []
        source = str(path)
    elif path.is_dir():
        files = [path / f"{name}{ext}" for name in SPLIT_FILES[split] for ext in (".jsonl", ".json", ".parquet")]
        found = next((f for f in files if f.is_file()), None)
        if found is None and split == "train":
            raise DataError(f"{path}: no train.jsonl (or .json/.parquet) in this folder")
        rows = _read_file(found, report) if found else []
        source = str(found)
    elif path.suffix in (".jsonl", ".json", ".parquet") or spec.startswith((".", "/", "~")):
        raise DataError(f"data file not found: {spec}")
    else:
        rows, source = _load_hub(spec, split), spec
    if split == "train" and not rows:
        raise DataError(f"{source}: no usable rows (each needs a non-empty 'prompt')")
    return rows, report.summary(source)


def _load_hub(name: str, split: str) -> list[dict]:
    import datasets

    try:
        ds = datasets.load_dataset(name)
    except Exception as e:  # offline, unknown name, ...: one clear line
        raise DataError(f"could not load dataset {name!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    names = [s for s in SPLIT_FILES[split] if s in ds]
    if not names:
        return []
    rows = [dict(r) for r in ds[names[0]]]
    missing = [i for i, r in enumerate(rows) if not _valid_prompt(r.get("prompt"))]
    if missing:
        raise DataError(f"{name}: {len(missing)} rows lack a usable 'prompt' column (first: row {missing[0]})")
    return rows


def prompt_messages(prompt, system_prompt: str | None) -> list[dict]:
    messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def encode_prompt(tokenizer, prompt, system_prompt: str | None = None) -> list[int]:
    """Token ids of the prompt: through the chat template when there is one."""
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(
            prompt_messages(prompt, system_prompt), add_generation_prompt=True, tokenize=True
        ))
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    if system_prompt:
        text = f"{system_prompt}\n\n{text}"
    return list(tokenizer.encode(text))
