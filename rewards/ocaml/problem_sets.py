"""The problem sets: the shipped ones, or the user's JSONL file or folder (``--data``)."""

from __future__ import annotations

from pathlib import Path

from ..jsonl import jsonl_records
from .grading import require_toolchain
from .prompts import to_row

DATA_DIR = Path(__file__).parent.parent / "ocaml_data"


def read_problems(path: str | Path) -> list[dict]:
    """Problem records from a JSONL file."""
    return [record for _, record in jsonl_records(path)]


# The shipped test file's first problems are the validation split (recipes are chosen on them), the rest test.
OCAML_VALIDATION_PROBLEMS = 109
SPLITS = ("train", "validation", "test")


def problems(split: str) -> list[dict]:
    """The shipped problems of a split ("train", "validation" or "test"), with their reference solutions."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    if split == "train":
        return read_problems(DATA_DIR / "train.jsonl")
    held_out = read_problems(DATA_DIR / "test.jsonl")
    return (
        held_out[:OCAML_VALIDATION_PROBLEMS]
        if split == "validation"
        else held_out[OCAML_VALIDATION_PROBLEMS:]
    )


def load_rows(split: str, config) -> list[dict]:
    """Rows of ``split``: {"prompt", "id", "difficulty", "signature", "preamble", "tests"}, and "solution"
    where the problem gives one (the reference answer for --guide).

    config.data: None (the shipped problems: problems()), a folder with train.jsonl,
    test.jsonl and maybe validation.jsonl, or one JSONL file (all train rows), each line a
    problem record as in ``rewards/ocaml_data``. A split the data lacks is [] (the registry
    carves it from train by a hash of each prompt: tasks/splits.py).
    """
    require_toolchain()
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    data = getattr(config, "data", None)
    first = 0  # where the split's records start in their file, so a row names its line
    if not data:
        path, records = DATA_DIR / f"{'train' if split == 'train' else 'test'}.jsonl", problems(split)
        first = OCAML_VALIDATION_PROBLEMS if split == "test" else 0
    else:
        path = Path(data).expanduser()
        if path.is_dir():
            path = path / f"{split}.jsonl"
            if not path.is_file():
                if split == "validation":
                    return []
                raise ValueError(f"{path.parent}: no {split}.jsonl in this folder")
            records = read_problems(path)
        elif path.is_file():
            records = read_problems(path) if split == "train" else []
        else:
            raise ValueError(f"data not found: {data}")
    compact = getattr(config, "model", None) is None  # the embedded tiny model: see format_prompt
    return [to_row(r, f"{path}:{first + i + 1}", compact) for i, r in enumerate(records)]


def recommended_settings(model: str | None) -> dict:
    """Below the YAML file and typed flags.

    A function with a code fence takes 60-250 tokens from a 0.5B instruct model;
    384 leaves room, and longer completions are nearly always runaways. Seed
    001 found 0.8 kept enough spread within groups. Nothing for the embedded
    tiny model, which knows no OCaml (the task runs on it, to check the wiring).
    """
    from mlx_grpo.tasks.registry import is_chat_model

    if not is_chat_model(model):
        return {}
    return {"max_tokens": 384, "temperature": 0.8}
