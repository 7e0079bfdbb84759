"""Which rows are held out, by one rule for every kind of data, and the record of what a run trained on.

A split belongs to the data, never to `--n` or eval_num_problems:

- data with its own validation and test splits keeps them;
- a split the data lacks is carved from its train rows by a hash of each row's prompt: a prompt whose
  hash falls in the first TEST_SHARE of the range is test, in the next VALIDATION_SHARE validation, and
  the rest train. The same prompt always lands on the same side, whatever number of rows is asked for,
  and repeats of a prompt land together;
- a prompt that stands in a held-out split is dropped from train (and from validation when it is in
  test), so a data set's own splits cannot leak through a repeated question either.

`--n` then takes the first N rows of the fixed split. The prompt is what identifies a row: a chat
conversation's user turns (its system and assistant turns left out), a plain prompt, or a text row's
text, with runs of whitespace read as one space, and the row's name where it has one (an "id" or
"task_id" column). sft's demonstrations and GRPO's prompt rows of the same questions therefore land
on the same side.

A run writes the keys of the rows it may train on into its folder (TRAINED_ROWS); `compare` and `eval`
refuse to score a model on a row any of its stages trained on (evaluation/held_out.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Iterable

from ..files import atomic_write_text

SPLIT_RULE = "prompt-sha256: first 10% test, next 10% validation"
TEST_SHARE = 0.10
VALIDATION_SHARE = 0.10
TRAINED_ROWS = "trained_rows.json"  # in a run folder: the keys of the rows the run may train on
# A row that names itself is told apart by its name as well as its prompt: the same question asked of two
# worlds (a web task's site, a multihop question's paragraphs) is two problems.
IDENTITY_COLUMNS = ("id", "task_id")


def prompt_text(row) -> str:
    """The text that identifies a row: its prompt, a conversation's user turns, or a text row's text."""
    if not isinstance(row, dict):
        return json.dumps(row, sort_keys=True, default=str)
    if "prompt" in row:
        prompt = row["prompt"]
    elif isinstance(row.get("messages"), list):
        users = [m for m in row["messages"] if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users or json.dumps(row["messages"], sort_keys=True, default=str)  # no user turn: all of it
    elif "text" in row:
        prompt = row["text"]
    else:
        return json.dumps(row, sort_keys=True, default=str)
    if isinstance(prompt, list):  # chat messages: the user's turns say what is asked
        turns = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = (
            "\n".join(t for t in turns if isinstance(t, str)) if turns else json.dumps(prompt, default=str)
        )
    if isinstance(prompt, str):
        return " ".join(prompt.split())
    return json.dumps(prompt, sort_keys=True, default=str)


def row_key(row) -> str:
    """A short, stable hash of a row's prompt (prompt_text), and of its name when it has one
    (IDENTITY_COLUMNS)."""
    text = prompt_text(row)
    if isinstance(row, dict):
        names = [str(row[c]) for c in IDENTITY_COLUMNS if isinstance(row.get(c), (str, int))]
        text = "\x00".join([text, *names])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def side_of(key: str) -> str:
    """Where a row whose data lacks held-out splits goes: "test", "validation" or "train"."""
    share = int(key[:8], 16) / 16**8
    if share < TEST_SHARE:
        return "test"
    return "validation" if share < TEST_SHARE + VALIDATION_SHARE else "train"


def split_held_out(
    train: list,
    validation: list | None,
    test: list | None,
    warnings: list[str],
    source: str,
    key: Callable = row_key,
) -> tuple[list, list, list]:
    """Every data set's three disjoint splits, train, validation and test, by the rule above.

    `key` gives a row's key (row_key by default; sft passes one for its numbered rows). Validation is
    what recipes are chosen on: a run's held-out check and `compare --split validation`. Test is
    measured at the end (`compare`, `eval`) and a run never looks at it."""
    validation, test = list(validation or []), list(test or [])
    missing = [name for name, rows in (("test", test), ("validation", validation)) if not rows]
    if missing:
        carved = {"train": [], "validation": [], "test": []}
        for row in train:
            side = side_of(key(row))
            carved[side if side in missing else "train"].append(row)
        train = carved["train"]
        for name in missing:
            rows = carved[name]
            if not rows:
                what = "no before/after accuracy" if name == "validation" else "nothing to test on"
                warnings.append(f"{source}: too few rows to hold any out as its {name} split; {what}")
            else:
                warnings.append(
                    f"{source} has no {name} split: holding out the {len(rows)} train rows whose "
                    f"prompt hashes into its share ({SPLIT_RULE})"
                )
            if name == "test":
                test = rows
            else:
                validation = rows
    held = {key(r) for r in test}
    kept = [r for r in validation if key(r) not in held]
    if len(kept) < len(validation):
        warnings.append(
            f"{source}: left out {len(validation) - len(kept)} validation rows whose prompt is also "
            "a test row's"
        )
    validation = kept
    held |= {key(r) for r in validation}
    kept = [r for r in train if key(r) not in held]
    if len(kept) < len(train):
        warnings.append(
            f"{source}: left out {len(train) - len(kept)} train rows whose prompt is also a held-out row's"
        )
    return kept, validation, test


def record_training_rows(
    run_dir: Path, rows: Iterable, task: str, data: str | None, key: Callable = row_key
) -> None:
    """Write the keys of the rows a run may train on into its folder (TRAINED_ROWS)."""
    keys = sorted({key(r) for r in rows})
    record = {"split_rule": SPLIT_RULE, "task": task, "data": data, "rows": len(keys), "keys": keys}
    text, path = json.dumps(record) + "\n", Path(run_dir) / TRAINED_ROWS
    try:
        if path.read_text(encoding="utf-8") == text:
            return  # a resumed run: the record it wrote stands
    except (OSError, ValueError):
        pass
    atomic_write_text(path, text)


def read_training_keys(run_dir: Path) -> set[str] | None:
    """The keys a run recorded (record_training_rows); None when it has no readable record."""
    try:
        record = json.loads((Path(run_dir) / TRAINED_ROWS).read_text(encoding="utf-8"))
        keys = record["keys"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {k for k in keys if isinstance(k, str)} if isinstance(keys, list) else None
