"""GSM8K: grade-school math word problems (openai/gsm8k, config "main").

Rows are {"prompt": question, "answer": gold number, "solution": worked solution}.
The gold number is what follows the solution's last ``####``, commas stripped.

The model is asked to reason step by step and end with a line ``#### N``. Its
final answer is read by ``extract_answer``, which looks, in order, for:

  1. the last ``#### N``;
  2. the last ``\\boxed{...}`` holding a number (nested braces are matched);
  3. the last ``<answer>...</answer>`` holding a number;
  4. the last number anywhere in the text (``last_number=True``, the default).

Inside a ``\\boxed{}`` or ``<answer>`` the last number counts, so
``\\boxed{6 \\times 7 = 42}`` reads as 42. Canonical numbers: ``$``, thousands
commas and spaces are dropped, ``1,234.00`` becomes ``1234``, ``-3.50`` becomes
``-3.5``. Fractions (``3/4``, ``\\frac{3}{4}``) are evaluated exactly: written as
a decimal when that is finite (``0.75``), else as a reduced fraction (``1/3``),
so two spellings of one value always give one string. Not read: mixed numbers
(``1 1/2``), spaces as thousands separators, scientific notation.

Rewards:
  correctness_reward  1.0 when the final answer equals the gold number (within
                      ANSWER_TOLERANCE), else 0.0; also the task's accuracy.
                      A completion cut at max_tokens is read without the
                      last-number fallback (4.): only an explicit answer counts.
                      Where the optional math-verify package is installed
                      (``pip install "mlx-grpo[math]"``), a boxed or tagged
                      answer that only it can read (``\\boxed{6 \\times 7}``)
                      is also accepted.
  format_reward       1.0 when the completion ends with a well-formed ``#### N``
                      line, else 0.0; weight 0.1 (see REWARDS).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from fractions import Fraction
from pathlib import Path

from rewards import completion_text

# math-verify warns once a process that its timeouts are off (outside the main thread): the
# length cap in _math_verify_match is the limit it asks for, so the warning would only alarm a user.
logging.getLogger("math_verify").setLevel(logging.ERROR)

SYSTEM_PROMPT: str | None = (
    "Solve the math problem step by step, showing your reasoning. "
    "Then give the final answer on its own last line in the form `#### N`, "
    "where N is just the number (no units, no $ sign)."
)

# A base model (no chat template, e.g. gemma3-270m) gets two worked train-split
# solutions in GSM8K's own form instead of instructions; its answer ends at the
# blank line before it would start the next question.
BASE_PROMPT_FORMAT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\n"
    "Answer: Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n"
    "#### 72\n\n"
    "Question: Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
    "How much did she earn?\n"
    "Answer: Weng earns 12/60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\n#### 10\n\n"
    "Question: {prompt}\nAnswer:"
)

# GSM8K gold answers are integers: the tolerance only forgives float noise and a
# rounded repeating decimal (0.3333 for 1/3); it never lets an off-by-one through.
ANSWER_TOLERANCE = 1e-4

# The answer datasets.load_dataset is asked for when --data is not given.
HUB_DATASET = ("openai/gsm8k", "main")

# ---------------------------------------------------------------------------
# Numbers


# A number as written in prose: optional minus, digits with optional thousands
# commas, optional decimals (or a bare ".5"), optional "/denominator".
# The lookbehind stops a match from starting inside another number ("1.2.3"),
# and a minus right after a digit is subtraction, not a sign ("5-3": 5 and 3).
_NUMBER = re.compile(
    r"(?<![\d.])(?:(?<![\w)])-)?"
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:\s*/\s*\d+(?:\.\d+)?(?!\d))?"
)
# After "####" a space between the minus and the digits is tolerated ("#### - 5").
_HASH_ANSWER = re.compile(r"####[ \t]*(-?)[ \t]*(" + _NUMBER.pattern + r")")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def _clean(text: str) -> str:
    """Undo the spellings that hide a number: dollar signs, LaTeX fractions and commas.

    Dollar signs go entirely ("$1,234", "\\$5" and LaTeX "$x$" delimiters alike):
    no GSM8K answer needs one, and they sit between a minus and its digits ("-$5").
    """
    text = text.replace("\u2212", "-")  # Unicode minus
    text = text.replace("\\$", "").replace("$", "")
    text = text.replace("{,}", ",").replace("\\!", "").replace("\\,", "")
    return _FRAC.sub(r"\1/\2", text)


def _value(token: str) -> Fraction | None:
    """The exact value of one matched number ("1,234.50", "-3/4"), or None."""
    token = token.replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            top, bottom = token.split("/", 1)
            bottom_value = Fraction(bottom)
            return Fraction(top) / bottom_value if bottom_value else None
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def format_number(value: Fraction) -> str:
    """Canonical text of a value: "1234", "-2.5", "0.75", or "1/3" when no finite decimal exists."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    for p in (2, 5):
        while denominator % p == 0:
            denominator //= p
    if denominator != 1:  # 1/3, 2/7: a decimal would have to be rounded
        return f"{value.numerator}/{value.denominator}"
    # A finite decimal: scale by a power of ten until it is a whole number.
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    scaled = abs(value * 10**digits).numerator
    whole, frac = divmod(scaled, 10**digits)
    sign = "-" if value < 0 else ""
    return f"{sign}{whole}.{str(frac).rjust(digits, '0').rstrip('0')}"


def canonical_number(text) -> str | None:
    """The canonical form of text that is one number ("$1,234.00" -> "1234"), else None.

    Surrounding spaces, a trailing "." and a percent sign are allowed;
    anything else around the number makes it not a number.
    """
    if text is None:
        return None
    cleaned = _clean(str(text)).strip().rstrip(".%").strip()
    cleaned = re.sub(r"^-\s+", "-", cleaned)
    if not cleaned or _NUMBER.fullmatch(cleaned) is None:
        return None
    value = _value(cleaned)
    return None if value is None else format_number(value)


def _last_number(text: str) -> str | None:
    """Canonical form of the last number in (already cleaned) text."""
    for match in reversed(list(_NUMBER.finditer(text))):
        value = _value(match.group(0))
        if value is not None:
            return format_number(value)
    return None


# ---------------------------------------------------------------------------
# Finding the model's answer


def _boxed_contents(text: str) -> list[str]:
    """Contents of every complete \\boxed{...}, braces matched; an unclosed one is skipped."""
    contents = []
    for match in re.finditer(r"\\boxed\s*\{", text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    contents.append(text[start:i])
                    break
    return contents


def _hash_answer(text: str) -> str | None:
    """The number of the last "#### N" (a "#### Step 2" heading is not one: N must follow directly)."""
    matches = list(_HASH_ANSWER.finditer(text))
    if not matches:
        return None
    sign, number = matches[-1].group(1), matches[-1].group(2)
    value = _value(number)
    if value is None:
        return None
    return format_number(-value if sign and not number.startswith("-") else value)


def find_answer(text: str, last_number: bool = True) -> tuple[str, str] | None:
    """(where, raw text) of the final answer: where is "hash", "boxed", "answer_tag" or "last_number".

    raw is the marker's whole content (a boxed expression, the text inside the
    tags) before any number is read from it; math-verify reads it as LaTeX.
    """
    text = completion_text(text)
    cleaned = _clean(text)
    matches = list(_HASH_ANSWER.finditer(cleaned))
    if matches:
        return "hash", matches[-1].group(0)[4:].strip()
    for content in reversed(_boxed_contents(text)):
        if _last_number(_clean(content)) is not None:
            return "boxed", content
    for content in reversed(_ANSWER_TAG.findall(text)):
        if _last_number(_clean(content)) is not None:
            return "answer_tag", content
    if last_number:
        found = list(_NUMBER.finditer(cleaned))
        if found:
            return "last_number", found[-1].group(0)
    return None


def extract_answer(text, last_number: bool = True) -> str | None:
    """The model's final answer as a canonical number string ("1234", "-3", "2.5"), else None.

    last_number=False accepts only an explicit answer (####, \\boxed, <answer>),
    never a number that merely happens to come last.
    """
    found = find_answer(text, last_number)
    if found is None:
        return None
    where, raw = found
    if where == "hash":
        return _hash_answer(_clean(completion_text(text)))
    return _last_number(_clean(raw))


def gold_answer(solution: str) -> str:
    """The gold number of a GSM8K solution: what follows its last "####", canonical."""
    if not isinstance(solution, str) or "####" not in solution:
        raise ValueError("no '####' line in the answer")
    number = canonical_number(solution.rsplit("####", 1)[1])
    if number is None:
        raise ValueError(f"the text after '####' is not a number: {solution.rsplit('####', 1)[1].strip()[:40]!r}")
    return number


# ---------------------------------------------------------------------------
# Comparing answers


def answers_match(predicted, gold, tolerance: float = ANSWER_TOLERANCE) -> bool:
    """Whether two numbers (canonical strings, ints, floats) are equal within `tolerance`."""
    if predicted is None or gold is None:
        return False
    a, b = _value(str(predicted)), _value(str(gold))
    if a is None:
        a = _value(canonical_number(predicted) or "")
    if b is None:
        b = _value(canonical_number(gold) or "")
    if a is None or b is None:
        return False
    return abs(a - b) <= tolerance  # exact: a float of a 400-digit difference overflows


def _math_verify_match(raw: str, gold) -> bool | None:
    """math-verify's verdict on a raw answer (LaTeX allowed), or None where it is not installed.

    Its timeouts use signal.alarm, which only works in the main thread; elsewhere
    they are switched off, and the length cap keeps sympy from being handed a
    pathological expression with no timeout to stop it.
    """
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    if len(raw) > 200:
        return False
    timeout = 3 if threading.current_thread() is threading.main_thread() else None
    try:
        target = parse("\\boxed{" + raw + "}", parsing_timeout=timeout)
        return bool(target) and bool(verify(parse(str(gold), parsing_timeout=timeout), target,
                                            timeout_seconds=timeout))
    except Exception:  # a parse it cannot do is a "no", never a crash
        return False


def is_correct(completion, gold, last_number: bool = True, finish_reason: str | None = None) -> bool:
    """Whether a completion's final answer equals the gold number.

    A completion cut at max_tokens (finish_reason "length") gave no final answer of
    its own: only an explicit one (####, \\boxed, <answer>) written before the cut
    counts, never the last number it happened to reach. SmolLM2-135M sampled on
    GSM8K at T=0.8: every one of its 3 "right" answers in 256 was a ramble cut at 256
    tokens whose last number matched (issue 27), noise that rewarding it would teach.
    """
    text = completion_text(completion)
    last_number = last_number and finish_reason != "length"
    if answers_match(extract_answer(text, last_number), gold):
        return True
    found = find_answer(text, last_number)
    # math-verify only widens what is accepted (expressions such as "6 \times 7"
    # in a box); the extraction order above stays the one that decides.
    return bool(found) and found[0] in ("boxed", "answer_tag") and _math_verify_match(found[1], gold) is True


# ---------------------------------------------------------------------------
# Rewards


def correctness_reward(prompts, completions, answer, finish_reason=None, **kwargs) -> list[float]:
    """1.0 where the completion's final answer equals the gold number, else 0.0 (a cut one: see is_correct)."""
    reasons = finish_reason or [None] * len(completions)
    return [1.0 if is_correct(c, a, finish_reason=f) else 0.0 for c, a, f in zip(completions, answer, reasons)]


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
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: malformed JSON ({e.msg})") from None
            rows.append(to_row(record, f"{path}:{number}"))
    return rows


def _held_out_size(n_rows: int, config) -> int:
    """How many of a single file's last rows are kept for evaluation (the engine's rule for custom data)."""
    return min(int(getattr(config, "eval_num_problems", 200)), n_rows // 10)


def _load_hub(name: str, subset: str | None, split: str) -> list[dict]:
    try:
        import datasets

        dataset = datasets.load_dataset(name, subset) if subset else datasets.load_dataset(name)
    except Exception as e:  # offline, unknown name, ...: one clear line
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(f"could not load the dataset {name!r} ({type(e).__name__}: {first_line}); "
                         f"without internet, pass --data with a local copy (train.jsonl/test.jsonl)") from None
    if split not in dataset:
        raise ValueError(f"dataset {name!r} has no {split!r} split (it has {', '.join(dataset)})")
    return [to_row(dict(r), f"{name} {split} row {i}") for i, r in enumerate(dataset[split])]


def load_rows(split: str, config) -> list[dict]:
    """Rows of `split` ("train" or "test"): {"prompt", "answer", "solution"}.

    config.data: None (the Hugging Face dataset openai/gsm8k, config "main"), a
    folder holding train.jsonl and test.jsonl, or one JSONL file (its last
    min(eval_num_problems, 10%) rows are the test split, the rest train), each
    row with "question" and "answer". Any other text is taken as a dataset name.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    data = getattr(config, "data", None)
    if not data:
        return _load_hub(*HUB_DATASET, split)
    path = Path(data).expanduser()
    if path.is_dir():
        file = path / f"{split}.jsonl"
        if not file.is_file():
            raise ValueError(f"{path}: no {split}.jsonl in this folder")
        return _read_jsonl(file)
    if path.is_file():
        rows = _read_jsonl(path)
        held_out = _held_out_size(len(rows), config)
        return rows[len(rows) - held_out:] if split == "test" else rows[:len(rows) - held_out]
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
        return {"system_prompt": "", "prompt_format": BASE_PROMPT_FORMAT, "stop": ["\n\n"], "max_tokens": 256,
                "eval_num_problems": 200}
    return {"max_tokens": 512, "eval_num_problems": 200}
