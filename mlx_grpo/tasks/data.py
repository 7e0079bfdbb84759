"""Prompt datasets: local JSONL/JSON/Parquet files, folders, or HF datasets.

A row is a dict with a "prompt" (text, or a list of chat messages) and any
other columns (e.g. "answer"), which are passed to the reward functions.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

SPLIT_FILES = {"train": ("train",), "validation": ("valid", "validation"), "test": ("test",)}


class DataError(ValueError):
    """A data problem the user can fix; the message says where."""


BAD_DATA_MODES = ("skip", "error")


@dataclass
class LoadReport:
    """Bad rows met while reading: skipped and counted, or (on_bad="error") the first one raises."""

    source: str = ""
    on_bad: str = "skip"
    rows: int = 0
    skipped: int = 0
    skipped_lines: list = field(default_factory=list)  # first few (line or row label, reason)

    def skip(self, line, reason: str, unit: str = "line"):
        if self.on_bad == "error":
            raise DataError(f"{self.source} {unit} {line}: {reason} (on_bad_data=skip would skip such rows)")
        self.skipped += 1
        if len(self.skipped_lines) < 5:
            self.skipped_lines.append((f"{unit} {line}", reason))

    def summary(self, source: str | None = None) -> str | None:
        if not self.skipped:
            return None
        where = "; ".join(f"{label}: {why}" for label, why in self.skipped_lines)
        first = "first 5: " if self.skipped > len(self.skipped_lines) else ""
        return (
            f"{source or self.source}: skipped {self.skipped} bad row(s) of {self.rows + self.skipped} "
            f"({first}{where})"
        )


def _text(x) -> bool:
    """A string the tokenizer can take: JSON's \\ud800 escapes give lone surrogates, which UTF-8 cannot
    encode."""
    if not isinstance(x, str):
        return False
    try:
        x.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _valid_prompt(prompt) -> bool:
    if isinstance(prompt, str):
        return _text(prompt) and bool(prompt.strip())
    if isinstance(prompt, list) and prompt:
        messages = all(
            isinstance(m, dict) and _text(m.get("role")) and _text(m.get("content")) for m in prompt
        )
        return messages and any(m["content"].strip() for m in prompt)
    return False


def _row_problem(row) -> str | None:
    if not isinstance(row, dict):
        return "not a JSON object"
    if "prompt" not in row:
        return "no 'prompt' column"
    if not _valid_prompt(row["prompt"]):
        return "empty or malformed prompt (text, or a list of {role, content} messages)"
    return None


def jsonl_records(f, report: LoadReport):
    """(line number, decoded value) of each non-blank line of a JSONL file opened in binary mode; a line
    that is not UTF-8 or not JSON is skipped into `report` with its reason."""
    for number, raw in enumerate(f, start=1):
        if not raw.strip():
            continue
        try:
            yield (
                number,
                json.loads(raw.decode("utf-8-sig")),
            )  # -sig: a byte-order mark (Windows editors) is dropped
        except UnicodeDecodeError:
            report.skip(number, "not UTF-8")
        except json.JSONDecodeError as e:
            report.skip(number, f"malformed JSON at column {e.colno} ({e.msg})")


def _checked(records, report: LoadReport, problem_of: Callable, unit: str) -> list[tuple[int, dict]]:
    """(number, row) of the records `problem_of` finds nothing wrong with; the others skipped into
    `report`."""
    rows = []
    for number, row in records:
        problem = problem_of(row)
        if problem:
            report.skip(number, problem, unit)
        else:
            rows.append((number, row))
    return rows


def _read_file(path: Path, report: LoadReport, problem_of: Callable) -> list[tuple[int, dict]]:
    try:
        return _read_any(path, report, problem_of)
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None


def _read_any(path: Path, report: LoadReport, problem_of: Callable) -> list[tuple[int, dict]]:
    if path.suffix == ".parquet":
        import datasets

        try:
            data = [dict(r) for r in datasets.Dataset.from_parquet(str(path))]
        except Exception as e:  # a damaged or foreign file: one clear line
            raise DataError(f"{path}: not a readable Parquet file ({type(e).__name__})") from None
        return _checked(enumerate(data, start=1), report, problem_of, unit="row")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise DataError(f"{path}: not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: malformed JSON at line {e.lineno} ({e.msg})") from None
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of rows")
        return _checked(enumerate(data, start=1), report, problem_of, unit="row")
    with open(path, "rb") as f:
        return _checked(jsonl_records(f, report), report, problem_of, unit="line")


def read_split(
    spec: str,
    split: str,
    problem_of: Callable = _row_problem,
    on_bad: str = "skip",
    needs: str = "a non-empty 'prompt'",
) -> tuple[list[tuple[int, dict]], str | None, str]:
    """((number, row) pairs, a note about skipped rows or None, where they came from) of `split`
    ("train", "validation" or "test"): the one reader of prompt rows and demonstrations alike.

    spec: a file (its rows are the train split; it has no other), a folder holding train.jsonl and
    maybe valid.jsonl (or validation.jsonl) and test.jsonl (or .json/.parquet), or a Hugging Face
    dataset name. A missing split is [] (tasks/splits.py carves it from train). `problem_of(row)` says
    why a row is unusable, or None. on_bad: "skip" bad rows (counted, first few reported) or "error"
    (DataError at the first one). `needs` says in the error what a usable row holds."""
    path = Path(spec).expanduser()
    report = LoadReport(source=str(path), on_bad=on_bad)
    if path.is_file():
        rows = _read_file(path, report, problem_of) if split == "train" else []
        source = str(path)
    elif path.is_dir():
        files = [
            path / f"{name}{ext}" for name in SPLIT_FILES[split] for ext in (".jsonl", ".json", ".parquet")
        ]
        found = next((f for f in files if f.is_file()), None)
        if found is None and split == "train":
            raise DataError(f"{path}: no train.jsonl (or .json/.parquet) in this folder")
        report.source = source = str(found or path)
        rows = _read_file(found, report, problem_of) if found else []
    elif path.suffix in (".jsonl", ".json", ".parquet") or spec.startswith((".", "/", "~")):
        raise DataError(f"data file not found: {spec}")
    else:
        report.source = source = spec
        rows = _load_hub(spec, split, report, problem_of)
    report.rows = len(rows)
    if split == "train" and not rows:
        skipped = f" ({report.summary(source)})" if report.skipped else ""
        raise DataError(f"{source}: no usable rows (each needs {needs}){skipped}")
    return rows, report.summary(source), source


def load_rows(spec: str, split: str, on_bad: str = "skip") -> tuple[list[dict], str | None]:
    """Prompt rows of `split` and a warning about skipped rows, if any (read_split)."""
    rows, note, _ = read_split(spec, split, _row_problem, on_bad)
    return [row for _, row in rows], note


def _load_hub(name: str, split: str, report: LoadReport, problem_of: Callable) -> list[tuple[int, dict]]:
    import datasets

    try:
        ds = datasets.load_dataset(name)
    except Exception as e:  # offline, unknown name, ...: one clear line
        raise DataError(
            f"could not load dataset {name!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    names = [s for s in SPLIT_FILES[split] if s in ds]
    if not names:
        return []
    return _checked(enumerate((dict(r) for r in ds[names[0]]), start=1), report, problem_of, unit="row")


def columns_of(rows: list[dict], repeat: int = 1, completions=None) -> dict[str, list]:
    """Dataset columns (everything but the prompt), one entry per completion.

    Given the completions, also `finish_reason` ("stop", "length"): a reward can tell an
    answer cut at max_tokens from a finished one, in training and evaluation alike."""
    keys = sorted({k for r in rows for k in r if k != "prompt"})
    columns = {k: [r.get(k) for r in rows for _ in range(repeat)] for k in keys}
    if completions is not None:
        columns.setdefault("finish_reason", [c.finish_reason for c in completions])
    return columns


def prompt_messages(prompt, system_prompt: str | None) -> list[dict]:
    messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def encode_prompt(
    tokenizer, prompt, system_prompt: str | None = None, prompt_format: str | None = None
) -> list[int]:
    """Token ids of the prompt: through the chat template when there is one, else as plain text.

    Plain text is `prompt_format` with the prompt where "{prompt}" stands (a
    base model's frame: worked examples, then the question), after the system
    prompt when there is one.
    """
    if getattr(tokenizer, "chat_template", None):
        from jinja2 import TemplateError

        # transformers renders templates in Jinja's immutable sandbox: a template (from a downloaded
        # file) that reaches for Python objects stops with a SecurityError, said here in one line.
        try:
            return list(
                tokenizer.apply_chat_template(
                    prompt_messages(prompt, system_prompt), add_generation_prompt=True, tokenize=True
                )
            )
        except TemplateError as e:
            raise DataError(
                f"the model's chat template cannot render a prompt ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else 'no message'})"
            ) from None
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    if prompt_format:
        text = prompt_format.replace("{prompt}", text)
    if system_prompt:
        text = f"{system_prompt}\n\n{text}"
    return list(tokenizer.encode(text))


def task_prompts(tokenizer, task, rows: list[dict]) -> list[list[int]]:
    """The token ids of rows' prompts as the task frames them; the task's stop strings end completions."""
    use_stop_strings(tokenizer, getattr(task, "stop", []))
    frame = getattr(task, "prompt_format", None)
    return [encode_prompt(tokenizer, r["prompt"], task.system_prompt, frame) for r in rows]


def stop_token_ids(tokenizer, stop: list[str]) -> set[int]:
    """Ids of the tokens whose text starts with a stop string.

    Matched a token at a time, so that the text before the stop is never cut
    out of the answer: a token with text before a newline ("7\n") does not stop
    the completion, and the next token that starts a new line does.
    """
    if not stop:
        return set()
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    texts = hf.batch_decode([[i] for i in range(len(hf))])
    return {i for i, text in enumerate(texts) if text.startswith(tuple(stop))}


def use_stop_strings(tokenizer, stop: list[str]) -> None:
    """Add the stop strings' tokens to the tokenizer's end tokens (once per tokenizer and list)."""
    if not stop or getattr(tokenizer, "_mlx_grpo_stop", None) == list(stop):
        return
    ids = stop_token_ids(tokenizer, stop)
    if not ids:
        raise DataError(f"no token of this tokenizer starts with any of the stop strings {stop!r}")
    tokenizer.eos_token_ids = set(tokenizer.eos_token_ids) | ids
    tokenizer._mlx_grpo_stop = list(stop)


def required_columns(functions) -> dict[str, str]:
    """Columns the reward functions cannot do without: {column: function name}.

    A parameter after (prompts, completions) that has no default must come
    from the data; `**kwargs` asks for nothing in particular.
    """
    needed = {}
    for fn in functions:
        try:
            params = list(inspect.signature(fn).parameters.values())[2:]
        except (TypeError, ValueError):
            continue
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty:
                needed.setdefault(p.name, getattr(fn, "__name__", "reward"))
    return needed


def prompt_token_limit(context: int | None, max_tokens: int, max_prompt_tokens: int | None) -> int | None:
    """The longest prompt allowed: max_prompt_tokens, else the model's context (its max_position_embeddings,
    None: unknown) minus max_tokens."""
    if max_prompt_tokens and context and max_prompt_tokens + max_tokens > context:
        raise DataError(
            f"max_prompt_tokens {max_prompt_tokens} + max_tokens {max_tokens} exceed the model's "
            f"context of {context} positions"
        )
    if max_prompt_tokens or not context:
        return max_prompt_tokens
    if max_tokens >= context:
        raise DataError(
            f"max_tokens {max_tokens} leaves no room for a prompt: the model's context is "
            f"{context} positions; lower max_tokens"
        )
    return context - max_tokens


def _too_long(
    tokenizer, prompt, system_prompt: str | None, limit: int, overhead: int, prompt_format: str | None = None
) -> int | None:
    """The prompt's token count if it is over `limit`, else None.

    Tokenizing every prompt of a large dataset is slow, so a text prompt is
    only encoded when its UTF-8 size could exceed the limit: a token covers at
    least one byte (byte-level BPE, SentencePiece with byte fallback), plus the
    chat template's own tokens (`overhead`) and a margin.
    """
    if not isinstance(prompt, (str, list)):
        return None  # rows of a multi-turn task may have no prompt of their own
    if isinstance(prompt, str):
        size = (
            len(prompt.encode("utf-8"))
            + len((system_prompt or "").encode("utf-8"))
            + len(prompt_format or "")
        )
        if size + overhead + 4 <= limit:
            return None
    n = len(encode_prompt(tokenizer, prompt, system_prompt, prompt_format))
    return n if n > limit else None


def screen_rows(
    rows: list[dict],
    tokenizer,
    system_prompt: str | None,
    needed: dict[str, str],
    limit: int | None,
    on_bad: str,
    source: str,
    prompt_format: str | None = None,
) -> tuple[list[dict], str | None]:
    """Rows the run can use: every column the rewards need, a prompt that fits the context.

    Returns (rows, warning); on_bad="error" raises DataError at the first bad row.
    Rows are numbered from 1 in the order they were loaded.
    """
    report = LoadReport(source=source, on_bad=on_bad)
    overhead = len(encode_prompt(tokenizer, "", system_prompt, prompt_format)) if limit else 0
    kept = []
    for number, row in enumerate(rows, start=1):
        missing = [c for c in needed if c not in row]
        n = (
            _too_long(tokenizer, row.get("prompt"), system_prompt, limit, overhead, prompt_format)
            if limit and not missing
            else None
        )
        if missing:
            report.skip(number, f"no {missing[0]!r} column (reward {needed[missing[0]]} needs it)", "row")
        elif n is not None:
            report.skip(number, f"prompt of {n} tokens is longer than the limit of {limit}", "row")
        else:
            kept.append(row)
    report.rows = len(kept)
    return kept, report.summary()


def screen_task(
    task,
    tokenizer,
    context: int | None,
    max_tokens: int,
    max_prompt_tokens: int | None,
    on_bad: str,
    training: bool = True,
) -> None:
    """Check a task's train and eval rows against its rewards and the model's context (its length in
    positions, None: unknown), in place. Only the tokenizer and the context are needed, not the model's
    weights (models/screen_info.py reads both from a model's files).

    Skipped rows become warnings on the task; no usable training row left is a DataError when `training`
    (compare and eval score held-out rows alone: data of test questions only needs no train rows).
    """
    needed = required_columns(task.reward_functions)
    limit = prompt_token_limit(context, max_tokens, max_prompt_tokens)
    task.train_rows, note = screen_rows(
        task.train_rows,
        tokenizer,
        task.system_prompt,
        needed,
        limit,
        on_bad,
        f"{task.name} training data",
        getattr(task, "prompt_format", None),
    )
    task.warnings += [note] if note else []
    if training and not task.train_rows:
        raise DataError(f"{task.name}: no usable training rows" + (f" ({note})" if note else ""))
    eval_needed = required_columns([task.accuracy_reward]) if task.accuracy_reward else {}
    task.eval_rows, note = screen_rows(
        task.eval_rows,
        tokenizer,
        task.system_prompt,
        eval_needed,
        limit,
        on_bad,
        f"{task.name} evaluation data",
        getattr(task, "prompt_format", None),
    )
    task.warnings += [note] if note else []
    task.test_rows, note = screen_rows(
        getattr(task, "test_rows", []),
        tokenizer,
        task.system_prompt,
        eval_needed,
        limit,
        on_bad,
        f"{task.name} test data",
        getattr(task, "prompt_format", None),
    )
    task.warnings += [note] if note else []
