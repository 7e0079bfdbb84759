"""Reading a final numeric answer out of a model's text, and comparing it with a gold number.

Used by the GSM8K task (rewards/gsm8k.py). ``extract_answer`` looks, in order, for:

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

``is_correct`` is the verdict the reward uses: a completion cut at max_tokens is
read without the last-number fallback, and where the optional math-verify
package is installed (``pip install "mlx-grpo[math]"``) a boxed or tagged answer
that only it can read (``\\boxed{6 \\times 7}``) is also accepted.
"""

from __future__ import annotations

import logging
import re
import threading
from fractions import Fraction

from rewards import completion_text

# math-verify warns once a process that its timeouts are off (outside the main thread): the
# length cap in _math_verify_match is the limit it asks for, so the warning would only alarm a user.
logging.getLogger("math_verify").setLevel(logging.ERROR)

# GSM8K gold answers are integers: the tolerance only forgives float noise and a
# rounded repeating decimal (0.3333 for 1/3); it never lets an off-by-one through.
ANSWER_TOLERANCE = 1e-4

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
        raise ValueError(
            f"the text after '####' is not a number: {solution.rsplit('####', 1)[1].strip()[:40]!r}"
        )
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
        return bool(target) and bool(
            verify(parse(str(gold), parsing_timeout=timeout), target, timeout_seconds=timeout)
        )
    except Exception:  # a parse it cannot do is a "no", never a crash
        return False


def is_correct(completion, gold, last_number: bool = True, finish_reason: str | None = None) -> bool:
    """Whether a completion's final answer equals the gold number.

    A completion cut at max_tokens (finish_reason "length") gave no final answer of
    its own: only an explicit one (####, \\boxed, <answer>) written before the cut
    counts, never the last number it happened to reach. SmolLM2-135M sampled on
    GSM8K at T=0.8: every one of its 3 "right" answers in 256 was a ramble cut at 256
    tokens whose last number matched, noise that rewarding it would teach.
    """
    text = completion_text(completion)
    last_number = last_number and finish_reason != "length"
    if answers_match(extract_answer(text, last_number), gold):
        return True
    found = find_answer(text, last_number)
    # math-verify only widens what is accepted (expressions such as "6 \times 7"
    # in a box); the extraction order above stays the one that decides.
    return bool(found) and found[0] in ("boxed", "answer_tag") and _math_verify_match(found[1], gold) is True
