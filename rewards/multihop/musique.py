"""MuSiQue rows for `--task multihop --data ...`: a local JSONL (or a folder of train/validation/test
files) or a Hugging Face dataset in MuSiQue's format, such as `bdsaglam/musique-mini`.

A folder's files: train.jsonl, validation.jsonl (or valid.jsonl) and test.jsonl, or MuSiQue's dev.jsonl
as test when there is no test.jsonl (MuSiQue's own test answers are not public). A folder with held-out
files and no train.jsonl is a set of questions to score (`compare`, `eval`): its train split is empty,
which a training run refuses.

A row needs "question", "answer" and "paragraphs" ([{"title", "paragraph_text",
"is_supporting"}]); "answer_aliases", "question_decomposition" and "id" are
kept when present. Rows marked "answerable": false (MuSiQue's full set has
them) have no answer to score and are skipped, as are malformed rows, counted
and named once.
"""

from __future__ import annotations

import json
from pathlib import Path

from mlx_grpo.tasks.data import SPLIT_FILES, DataError, LoadReport


def row_problem(row) -> str | None:
    if not isinstance(row, dict):
        return "not a JSON object"
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            return f"no {key!r} text"
    paragraphs = row.get("paragraphs")
    if not isinstance(paragraphs, list) or not paragraphs:
        return "no 'paragraphs' list"
    for p in paragraphs:
        if (
            not isinstance(p, dict)
            or not isinstance(p.get("title"), str)
            or not isinstance(p.get("paragraph_text"), str)
        ):
            return "a paragraph without 'title' and 'paragraph_text' text"
    aliases = row.get("answer_aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        return "'answer_aliases' is not a list of texts"
    if row.get("answerable") is False:
        return "unanswerable (answerable: false)"
    return None


def task_row(row: dict) -> dict:
    """A MuSiQue row as the task's row: "prompt" is the question; the rest is kept as it is."""
    return {
        **row,
        "prompt": row["question"],
        "answer_aliases": list(row.get("answer_aliases") or []),
        "paragraphs": [
            {
                "idx": p.get("idx", i),
                "title": p["title"],
                "paragraph_text": p["paragraph_text"],
                "is_supporting": bool(p.get("is_supporting", False)),
            }
            for i, p in enumerate(row["paragraphs"])
        ],
    }


def _jsonl(path: Path, report: LoadReport):
    """(where, record) of each line that is JSON, in order; lines that are not are skipped (counted) here."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8-sig"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                report.skip(
                    number,
                    "not UTF-8"
                    if isinstance(e, UnicodeDecodeError)
                    else f"malformed JSON at column {e.colno} ({e.msg})",
                )
                continue
            yield f"line {number}", record


def _split_file(folder: Path, split: str) -> Path | None:
    names = SPLIT_FILES[split] + (("dev",) if split == "test" else ())
    return next((folder / f"{n}.jsonl" for n in names if (folder / f"{n}.jsonl").is_file()), None)


def held_out_only(spec: str) -> bool:
    """A folder of questions to score only: held-out files and no train.jsonl."""
    path = Path(spec).expanduser()
    return (
        path.is_dir()
        and _split_file(path, "train") is None
        and any(_split_file(path, split) for split in ("validation", "test"))
    )


def _records(spec: str, split: str, report: LoadReport) -> list[tuple[str, object]]:
    path = Path(spec).expanduser()
    if path.is_file():
        return _jsonl(path, report) if split == "train" else []
    if path.is_dir():
        found = _split_file(path, split)
        if found is None and split == "train":
            raise DataError(
                f"{path}: no train.jsonl (nor test.jsonl, dev.jsonl or validation.jsonl) in this folder"
            )
        report.source = str(found or path)
        return _jsonl(found, report) if found else []
    if path.suffix in (".jsonl", ".json") or spec.startswith((".", "/", "~")):
        raise DataError(f"data file not found: {spec}")
    import datasets

    try:
        dataset = datasets.load_dataset(spec)
    except Exception as e:  # offline, unknown name, ...: one clear line
        raise DataError(
            f"could not load dataset {spec!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    names = [s for s in SPLIT_FILES[split] + (("dev",) if split == "test" else ()) if s in dataset]
    return [(f"row {i}", dict(r)) for i, r in enumerate(dataset[names[0]], start=1)] if names else []


def load_musique(spec: str, split: str, on_bad: str = "skip") -> tuple[list[dict], str | None]:
    """The task rows of one split ("train", "validation" or "test"; MuSiQue's "dev" is test) and a note about
    skipped rows (or a folder's missing train.jsonl), if any."""
    if split == "train" and held_out_only(spec):
        return [], f"{spec} has no train.jsonl: its questions are to score (compare, eval), not to train on"
    report = LoadReport(source=spec, on_bad=on_bad)
    rows = []
    for where, raw in _records(spec, split, report):
        problem = row_problem(raw)
        if problem:
            unit, number = where.split()
            report.skip(number, problem, unit=unit)
        else:
            rows.append(task_row(raw))
    report.rows = len(rows)
    if split == "train" and not rows:
        raise DataError(
            f"{spec}: no usable MuSiQue rows (each needs question, answer and paragraphs)"
            + (f" ({report.summary()})" if report.skipped else "")
        )
    return rows, report.summary()
