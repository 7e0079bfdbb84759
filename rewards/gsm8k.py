"""GSM8K: grade-school math word problems (openai/gsm8k, config "main").

Rows are {"prompt": question, "answer": gold number, "solution": worked solution}.
The gold number is what follows the solution's last ``####``, commas stripped.

The model is asked to reason step by step and end with a line ``#### N``. Its
final answer is read by rewards/math_answer.py (``#### N``, then ``\\boxed{}``,
then ``<answer>``, then the last number; the order and the canonical numbers
are written there).

Rewards:
  correctness_reward  1.0 when the final answer equals the gold number (within
                      math_answer.ANSWER_TOLERANCE), else 0.0; also the task's
                      accuracy. A completion cut at max_tokens counts only with
                      an explicit answer (math_answer.is_correct).
  format_reward       1.0 when the completion ends with a well-formed ``#### N``
                      line, else 0.0; weight 0.1 (see REWARDS).
"""

from __future__ import annotations

import re
from pathlib import Path

from rewards import completion_text
from rewards.jsonl import jsonl_records

# Re-exported: the GSM8K task's answer reading, by the names notebooks and tests use.
from rewards.math_answer import (  # noqa: F401
    ANSWER_TOLERANCE,
    answers_match,
    canonical_number,
    extract_answer,
    find_answer,
    format_number,
    gold_answer,
    is_correct,
)

SYSTEM_PROMPT: str | None = (
    "Solve the math problem step by step, showing your reasoning. "
    "Then give the final answer on its own last line in the form `#### N`, "
    "where N is just the number (no units, no $ sign)."
)

# A base model (no chat template, e.g. gemma3-270m) gets two worked train-split
# solutions in GSM8K's own form instead of instructions; its answer ends at the
# blank line before it would start the next question.
BASE_PROMPT_FORMAT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?\n"
    "Answer: Natalia sold 48/2 = 24 clips in May.\n"
    "Natalia sold 48+24 = 72 clips altogether in April and May.\n"
    "#### 72\n\n"
    "Question: Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
    "How much did she earn?\n"
    "Answer: Weng earns 12/60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\n#### 10\n\n"
    "Question: {prompt}\nAnswer:"
)

# The answer datasets.load_dataset is asked for when --data is not given.
HUB_DATASET = ("openai/gsm8k", "main")

# ---------------------------------------------------------------------------
# Rewards


def correctness_reward(prompts, completions, answer, finish_reason=None, **kwargs) -> list[float]:
    """1.0 where the completion's final answer equals the gold number, else 0.0 (a cut one: see
    is_correct)."""
    reasons = finish_reason or [None] * len(completions)
    return [
        1.0 if is_correct(c, a, finish_reason=f) else 0.0 for c, a, f in zip(completions, answer, reasons)
    ]


def format_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 where the completion's last non-empty line is "#### N" with N a number, else 0.0."""
    scores = []
    for c in completions:
        lines = [line.strip() for line in completion_text(c).splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        ok = last.startswith("####") and canonical_number(last[4:]) is not None
        scores.append(1.0 if ok else 0.0)
    return scores


# The accuracy before/after training is the correctness reward's mean.
accuracy_reward = correctness_reward


def reference_answer(row: dict) -> str | None:
    """The worked solution as a model should write it (--guide): calculator notes dropped, "#### N" last.

    GSM8K writes each calculation twice, "48/2 = <<48/2=24>>24 clips"; the note in
    angle brackets is for a calculator tool, not for the reader.
    """
    solution = row.get("solution")
    if not isinstance(solution, str) or "####" not in solution:
        return None
    return re.sub(r"<<[^<>]*>>", "", solution).strip()


# The format reward gets a small weight rather than 0: a right answer (1.0)
# always outranks a tidy wrong one (0.1), but inside a group where every answer
# is equally right or wrong it still separates the completions that end in a
# readable "#### N" line, so the group has a gradient toward the asked-for format
# (and the eval depends less on the last-number fallback).
REWARDS = [(correctness_reward, 1.0), (format_reward, 0.1)]


# ---------------------------------------------------------------------------
# Data


def to_row(record: dict, where: str) -> dict:
    """A task row from a GSM8K record {"question", "answer"}; ValueError names `where`."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object")
    question, solution = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: no 'question' text")
    try:
        gold = gold_answer(solution)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return {"prompt": question, "answer": gold, "solution": solution}


def _read_jsonl(path: Path) -> list[dict]:
    return [to_row(record, where) for where, record in jsonl_records(path)]


def _load_hub(name: str, subset: str | None, split: str) -> list[dict]:
    try:
        import datasets

        dataset = datasets.load_dataset(name, subset) if subset else datasets.load_dataset(name)
    except Exception as e:  # offline, unknown name, ...: one clear line
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(
            f"could not load the dataset {name!r} ({type(e).__name__}: {first_line}); "
            f"without internet, pass --data with a local copy (train.jsonl/test.jsonl)"
        ) from None
    if split not in dataset:
        raise ValueError(f"dataset {name!r} has no {split!r} split (it has {', '.join(dataset)})")
    return [to_row(dict(r), f"{name} {split} row {i}") for i, r in enumerate(dataset[split])]


def load_rows(split: str, config) -> list[dict]:
    """Rows of `split` ("train", "validation" or "test"): {"prompt", "answer", "solution"}.

    config.data: None (the Hugging Face dataset openai/gsm8k, config "main"), a
    folder holding train.jsonl, test.jsonl and maybe validation.jsonl (or valid.jsonl),
    or one JSONL file (all train rows), each row with "question" and "answer". Any other
    text is taken as a dataset name. A split the data lacks (a file's test and validation,
    a folder's validation) is [] here: the registry carves it from train by a hash of each
    question (tasks/splits.py), so recipes are never chosen on the test split.
    """
    if split not in ("train", "validation", "test"):
        raise ValueError(f"split must be 'train', 'validation' or 'test', not {split!r}")
    data = getattr(config, "data", None)
    path = Path(data).expanduser() if data else None
    if split == "validation":
        files = [path / f"{name}.jsonl" for name in ("validation", "valid")] if path and path.is_dir() else []
        return next((_read_jsonl(f) for f in files if f.is_file()), [])
    if not data:
        return _load_hub(*HUB_DATASET, split)
    if path.is_dir():
        file = path / f"{split}.jsonl"
        if not file.is_file():
            raise ValueError(f"{path}: no {split}.jsonl in this folder")
        return _read_jsonl(file)
    if path.is_file():
        return _read_jsonl(path) if split == "train" else []
    if path.suffix in (".jsonl", ".json") or str(data).startswith((".", "/", "~")):
        raise ValueError(f"data not found: {data}")
    return _load_hub(str(data), None, split)


def recommended_settings(model: str | None) -> dict:
    """Below the YAML file and typed flags.

    GSM8K solutions by a 0.5B-7B instruct model take 150-350 tokens; 512 leaves
    room without letting runaway completions eat the step. 200 eval problems
    keep a greedy eval to a minute or two on a Mac (the whole test split is 1,319).
    """
    from mlx_grpo.tasks.registry import is_base_model

    if is_base_model(model):
        return {
            "system_prompt": "",
            "prompt_format": BASE_PROMPT_FORMAT,
            "stop": ["\n\n"],
            "max_tokens": 256,
            "eval_num_problems": 200,
        }
    return {"max_tokens": 512, "eval_num_problems": 200}
