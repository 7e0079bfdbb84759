"""The embedded synthetic task "arith": short English word problems.

Each problem is a one- or two-step calculation with small numbers, written the way GSM8K writes
its worked solutions: one equation per line, then a final line ``#### N``. Rewards score
the number after the last ``####``.

The problems are deliberately small (single-digit operands, answers below 100) so that a
tiny model trained on this machine in minutes can do the arithmetic; what it has to get
right is which operation the story asks for.

Train and test never share a problem: every prompt belongs to exactly one split, decided
by a hash of its text, and ``generate_problems`` only returns prompts of the split asked for.
"""

from __future__ import annotations

import random
import re
import zlib

from rewards import completion_text

# The tiny model is trained without a system prompt, so none is used.
SYSTEM_PROMPT: str | None = None
# A chat model is told the answer form its scorer reads (last_number_reward). Asking
# for a "#### N" line instead made SmolLM2-135M write long chains cut at max_tokens
# (accuracy 0.000); asking for the number alone gave 0.33 before training.
CHAT_SYSTEM_PROMPT = "Answer with only the final number."
# A base model (no chat template, e.g. gemma3-270m) gets no instructions: two worked
# examples (train-split problems) show the form, and the answer ends at its newline.
# It is scored as a chat model is (last_number_reward on that one line).
BASE_PROMPT_FORMAT = (
    "Question: Ben has 3 cards. He buys 2 more. How many cards does he have now?\nAnswer: 5\n\n"
    "Question: Ben has 2 bags with 6 cards in each bag. How many cards does he have?\nAnswer: 12\n\n"
    "Question: {prompt}\nAnswer:"
)

# (name, subject pronoun at the start of a sentence, the same inside a sentence)
NAMES = [
    ("Tom", "He", "he"),
    ("Sam", "He", "he"),
    ("Ben", "He", "he"),
    ("Max", "He", "he"),
    ("Leo", "He", "he"),
    ("Ann", "She", "she"),
    ("Eva", "She", "she"),
    ("Mia", "She", "she"),
    ("Zoe", "She", "she"),
    ("Lily", "She", "she"),
]
ITEMS = ["apples", "pens", "books", "cards", "coins", "shells", "stamps", "marbles"]

# The kinds of problem ("templates"), in a fixed order.
TEMPLATES = ["add", "give", "groups", "two_step", "fewer"]

# One prompt in this many (by a hash of its text) belongs to the test split.
_TEST_BUCKETS = 5


def compute(x: int, op: str, y: int) -> int:
    """The value of ``x op y`` for the operations the task uses."""
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    raise ValueError(f"unknown operation {op!r}")


def format_solution(steps: list[tuple[int, str, int]]) -> tuple[str, int]:
    """Write equations, one per line, then ``#### result``; returns (text, result).

    ``steps`` are (x, op, y) triples; the result of the last one is the final answer.
    """
    lines = []
    result = 0
    for x, op, y in steps:
        result = compute(x, op, y)
        lines.append(f"{x} {op} {y} = {result}")
    lines.append(f"#### {result}")
    return "\n".join(lines), result


def correct_steps(template: str, numbers: list[int]) -> list[tuple[int, str, int]]:
    """The equations of the right worked solution for a template and its numbers."""
    if template == "add":
        a, b = numbers
        return [(a, "+", b)]
    if template in ("give", "fewer"):
        a, b = numbers
        return [(a, "-", b)]
    if template == "groups":
        a, b = numbers
        return [(a, "*", b)]
    if template == "two_step":
        a, b, c = numbers
        return [(a, "+", b), (a + b, "-", c)]
    raise ValueError(f"unknown template {template!r}")


def _draw_numbers(rng: random.Random, template: str) -> list[int]:
    """Operands for a template: small, and with a positive answer."""
    if template in ("add", "give", "fewer"):
        # a > b keeps both a + b and a - b positive.
        a = rng.randint(3, 9)
        b = rng.randint(2, a - 1)
        return [a, b]
    if template == "groups":
        return [rng.randint(2, 9), rng.randint(2, 9)]
    if template == "two_step":
        # a + b stays below 10, so both steps use the same one-digit facts as the
        # one-step problems.
        a = rng.randint(2, 7)
        b = rng.randint(2, 9 - a)
        c = rng.randint(2, a + b - 1)
        return [a, b, c]
    raise ValueError(f"unknown template {template!r}")


def _write_prompt(rng: random.Random, template: str, numbers: list[int]) -> str:
    """The question text for a template: a name, an item and the numbers."""
    name, He, he = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    if template == "add":
        a, b = numbers
        return f"{name} has {a} {item}. {He} buys {b} more. How many {item} does {he} have now?"
    if template == "give":
        a, b = numbers
        return f"{name} has {a} {item}. {He} gives {b} to a friend. How many {item} does {he} have left?"
    if template == "groups":
        a, b = numbers
        return f"{name} has {a} bags with {b} {item} in each bag. How many {item} does {he} have?"
    if template == "two_step":
        a, b, c = numbers
        return f"{name} has {a} {item}. {He} buys {b} more, then loses {c}. How many {item} are left?"
    if template == "fewer":
        a, b = numbers
        other = rng.choice([n for n in NAMES if n[0] != name])[0]
        return (
            f"{name} has {a} {item}. {other} has {b} fewer {item} than {name}. "
            f"How many {item} does {other} have?"
        )
    raise ValueError(f"unknown template {template!r}")


def split_of(prompt: str) -> str:
    """Which split a prompt belongs to ("train" or "test"), fixed by a hash of its text."""
    return "test" if zlib.crc32(prompt.encode("utf-8")) % _TEST_BUCKETS == 0 else "train"


def make_problem(rng: random.Random, template: str | None = None) -> dict:
    """One random problem (of any split); the template is drawn uniformly unless given."""
    if template is None:
        template = rng.choice(TEMPLATES)
    numbers = _draw_numbers(rng, template)
    prompt = _write_prompt(rng, template, numbers)
    solution, result = format_solution(correct_steps(template, numbers))
    return {
        "prompt": prompt,
        "answer": str(result),
        "solution": solution,
        "template": template,
        "numbers": numbers,
    }


def generate_problems(n: int, seed: int, split: str = "train") -> list[dict]:
    """``n`` problems of one split, the same ones for the same (seed, split).

    Each dict has "prompt" (question text, no chat formatting), "answer" (the final number
    as a string), "solution" (worked solution ending in ``#### N``), "template" and
    "numbers" (the operands).

    Test problems are distinct from each other (a clean held-out set). Train problems are
    independent draws, so a prompt can repeat in a long list: insisting on distinct ones
    would starve the templates with few possible prompts and skew the mix.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    # A string seed makes Python's RNG independent of the interpreter's hash seed.
    rng = random.Random(f"arith/{split}/{seed}")
    problems: list[dict] = []
    seen: set[str] = set()
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise ValueError(f"cannot find {n} distinct {split} problems")
        problem = make_problem(rng)
        if split_of(problem["prompt"]) != split:
            continue
        if split == "test":
            if problem["prompt"] in seen:
                continue
            seen.add(problem["prompt"])
        problems.append(problem)
    return problems


_ANSWER_RE = re.compile(r"####\s*(-?\s*[\d,]*\d(?:\.\d+)?)")


def extract_answer(text: str) -> str | None:
    """The number after the last ``####`` with spaces and commas removed, else None."""
    if not isinstance(text, str):
        return None
    marker = text.rfind("####")
    if marker < 0:
        return None
    match = _ANSWER_RE.match(text, marker)
    if match is None:
        return None
    return match.group(1).replace(",", "").replace(" ", "")


def _same_number(a: str | None, b) -> bool:
    """Whether two numbers written as text are equal (False if either is not a number)."""
    if a is None or b is None:
        return False
    try:
        return float(a) == float(str(b).replace(",", "").strip())
    except ValueError:
        return False


def correctness_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 where the completion's final ``#### N`` equals the answer numerically, else 0.0."""
    return [
        1.0 if _same_number(extract_answer(completion_text(c)), a) else 0.0
        for c, a in zip(completions, answer)
    ]


_FINAL_LINE_RE = re.compile(r"#### -?\d[\d,]*(\.\d+)?")


def format_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 where the completion ends with a well-formed ``#### N`` line, else 0.0."""
    scores = []
    for c in completions:
        lines = completion_text(c).strip().splitlines()
        ok = bool(lines) and _FINAL_LINE_RE.fullmatch(lines[-1].strip()) is not None
        scores.append(1.0 if ok else 0.0)
    return scores


# A number in prose; a minus right after a word character is subtraction ("5-3"), not a sign.
_NUMBER_RE = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number in the text, commas removed, else None."""
    if not isinstance(text, str):
        return None
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def last_number_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 where the last number in the completion equals the answer, else 0.0 (a chat model's scorer)."""
    return [
        1.0 if _same_number(last_number(completion_text(c)), a) else 0.0 for c, a in zip(completions, answer)
    ]


# ---------------------------------------------------------------------------
# The task protocol (see mlx_grpo/tasks/registry.py)

TRAIN_PROBLEMS = 20_000
ARITH_VALIDATION_PROBLEMS = 1000  # the held-out stream's first problems: validation (load_rows)

# The format reward is watched, not optimised: the tiny model already writes the format.
REWARDS = [(correctness_reward, 1.0), (format_reward, 0.0)]
accuracy_reward = correctness_reward
CHAT_REWARDS = [(last_number_reward, 1.0)]
chat_accuracy_reward = last_number_reward


def reference_answer(row: dict) -> str | None:
    """The worked solution ("4 - 2 = 2\n#### 2"), what --guide puts into a group with no right answer.

    It is the embedded model's own format, and it ends with the answer, which is
    what the chat variant's last-number reward reads."""
    return row.get("solution")


def load_rows(split: str, config) -> list[dict] | None:
    """Generated problems: the train split follows the run's seed; validation and test are fixed.

    Held-out problems are one stream of distinct problems (seed 0, the "test" hash bucket, so
    never a train prompt): its first ARITH_VALIDATION_PROBLEMS are validation, the ones after
    them test; each split gives its first eval_num_problems.

    With --data the rows are the user's ({"prompt", "answer"}): None hands them
    to the engine's generic loader.
    """
    if config.data:
        return None
    if split == "train":
        return generate_problems(TRAIN_PROBLEMS, seed=config.seed, split="train")
    if split == "validation":
        return generate_problems(
            min(config.eval_num_problems, ARITH_VALIDATION_PROBLEMS), seed=0, split="test"
        )
    if split != "test":
        raise ValueError(f"split must be 'train', 'validation' or 'test', not {split!r}")
    return generate_problems(ARITH_VALIDATION_PROBLEMS + config.eval_num_problems, seed=0, split="test")[
        ARITH_VALIDATION_PROBLEMS:
    ]


def recommended_settings(model: str | None) -> dict:
    """Tuned for the embedded tiny model; for a chat model, the recipe measured on SmolLM2-135M-Instruct.

    Embedded: lr 5e-4 and above drove the tiny model into runaway completions
    (KL > 5 within 20 steps); 1e-4 learns steadily. Completions are 12-20 tokens.

    Chat models: at temperature 1.0 SmolLM2's sampled reward was 0 from the
    second step (every group alike, nothing to learn); 0.8 kept right and wrong
    answers inside groups, and lr 3e-5 with 6 prompts x 8 took held-out accuracy
    from 0.33 to 0.62 in 15 steps (docs/real-models.md, "arith on SmolLM2-135M-Instruct").
    """
    from mlx_grpo.tasks.registry import is_base_model, is_chat_model

    if is_base_model(model):
        return {
            "system_prompt": "",
            "prompt_format": BASE_PROMPT_FORMAT,
            "stop": ["\n"],
            "max_tokens": 8,
            "temperature": 1.0,
            "lr": 3e-5,
            "batch_size": 6,
            "group_size": 8,
            "warmup_steps": 2,
            "eval_num_problems": 100,
        }
    if is_chat_model(model):
        return {
            "system_prompt": CHAT_SYSTEM_PROMPT,
            "max_tokens": 48,
            "temperature": 0.8,
            "lr": 3e-5,
            "batch_size": 6,
            "group_size": 8,
            "warmup_steps": 2,
            "eval_num_problems": 100,
        }
    return {
        "max_tokens": 48,
        "lr": 1e-4,
        "steps": 100,
        "batch_size": 8,
        "group_size": 8,
        "warmup_steps": 3,
        "micro_batch_size": 64,
        "save_every": 50,
    }
