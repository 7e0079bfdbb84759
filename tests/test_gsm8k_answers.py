"""GSM8K answers: extraction (with and without the last-number fallback), numbers in canonical form,
matching, and the correctness and format rewards, each worked by hand."""

import logging

import pytest

from rewards import gsm8k, math_answer
from rewards.gsm8k import (
    answers_match,
    canonical_number,
    correctness_reward,
    extract_answer,
    format_reward,
)


# (completion, expected answer with the last-number fallback on, expected with it off)
EXTRACTION_CASES = [
    # "#### N", the asked-for format
    ("Tom has 3 + 4 = 7 apples.\n#### 7", "7", "7"),
    ("#### 42", "42", "42"),
    ("####42", "42", "42"),
    ("Step one.\n#### $1,234.00", "1234", "1234"),
    ("#### 1,234", "1234", "1234"),
    ("#### -3", "-3", "-3"),
    ("#### - 5", "-5", "-5"),
    ("#### 2.50", "2.5", "2.5"),
    ("#### 18.", "18", "18"),
    ("#### 18.0", "18", "18"),
    ("#### 3/4", "0.75", "0.75"),
    ("#### 007", "7", "7"),
    # traps around "####"
    ("#### 42\n\nNote: 3 apples were eaten on day 2.", "42", "42"),  # numbers after the answer
    ("First guess #### 10\nWait, recount.\n#### 12", "12", "12"),  # the last one counts
    ("#### Step 2: add them\n5 + 6 = 11", "11", None),  # a Markdown heading is not an answer
    ("#### 9 apples", "9", "9"),
    ("#### 5\nThe boxed form: \\boxed{6}", "5", "5"),  # #### before \boxed
    # \boxed{...}
    ("So the answer is \\boxed{72}.", "72", "72"),
    ("\\boxed{1,000} dollars", "1000", "1000"),
    ("\\boxed{\\frac{3}{4}}", "0.75", "0.75"),  # nested braces
    ("\\boxed{\\text{42 apples}}", "42", "42"),
    ("\\boxed{6 \\times 7 = 42}", "42", "42"),
    ("First \\boxed{3}, then corrected: \\boxed{4}", "4", "4"),
    ("\\boxed{-12}", "-12", "-12"),
    ("\\boxed{\\$15.50}", "15.5", "15.5"),
    ("\\boxed{1{,}234}", "1234", "1234"),
    ("Final: \\boxed{8} and \\boxed{x}", "8", "8"),  # a box without a number is skipped
    ("The answer is \\boxed{9", "9", None),  # unclosed box: only the fallback reads it
    ("\\boxed{5}\n<answer>6</answer>", "5", "5"),  # \boxed before <answer>
    # <answer> tags
    ("<think>2 + 2 = 4</think><answer>4</answer>", "4", "4"),
    ("<answer>\n  $1,050\n</answer>", "1050", "1050"),
    ("<answer>The total is 18 dollars</answer> after 2 days", "18", "18"),
    ("<ANSWER>-0.5</ANSWER>", "-0.5", "-0.5"),
    ("<answer>none</answer> 12 13", "13", None),  # tags without a number
    # the last-number fallback
    ("She has 5 apples and buys 3 more, so 8.", "8", None),
    ("The answer is 42.", "42", None),  # trailing period
    ("The cost is $1,234.", "1234", None),
    ("The temperature is -4 degrees.", "-4", None),
    ("From 10-7 we get 3", "3", None),  # a minus after a digit is subtraction
    ("Each gets 3/4 of a pizza", "0.75", None),
    ("One third is 1/3", "1/3", None),  # no finite decimal: the reduced fraction
    ("Half of it is .5", "0.5", None),
    ("It costs 2.75 dollars", "2.75", None),
    ("The total grew by 12.0%", "12", None),
    ("The answer is \u22127", "-7", None),  # Unicode minus
    ("$\\frac{5}{2}$ hours", "2.5", None),
    # no answer at all
    ("I don't know.", None, None),
    ("", None, None),
    ("####", None, None),
]


@pytest.mark.parametrize("text,with_fallback,without_fallback", EXTRACTION_CASES)
def test_extract_answer(text, with_fallback, without_fallback):
    assert extract_answer(text) == with_fallback
    assert extract_answer(text, last_number=False) == without_fallback


def test_extraction_covers_enough_cases():
    assert len(EXTRACTION_CASES) >= 40


def test_extract_answer_reads_chat_messages():
    assert extract_answer([{"role": "assistant", "content": "#### 6"}]) == "6"
    assert extract_answer(None) is None


@pytest.mark.parametrize(
    "text,expected",
    [
        ("1234", "1234"),
        ("$1,234.00", "1234"),
        (" -3 ", "-3"),
        ("2.50", "2.5"),
        ("18.", "18"),
        ("3/4", "0.75"),
        ("-2/6", "-1/3"),
        ("10/5", "2"),
        ("50%", "50"),
        ("0.000", "0"),
        ("12 apples", None),
        ("", None),
        (None, None),
        ("1/0", None),
        ("abc", None),
    ],
)
def test_canonical_number(text, expected):
    assert canonical_number(text) == expected


@pytest.mark.parametrize(
    "predicted,gold,expected",
    [
        ("42", "42", True),
        ("42.0", "42", True),
        ("1234", "1,234", True),
        ("-3", "-3", True),
        ("3", "-3", False),
        ("43", "42", False),  # an off-by-one is never forgiven
        ("1000001", "1000000", False),
        ("0.3333", "1/3", True),  # within the 1e-4 tolerance
        ("0.333", "1/3", False),  # outside it
        ("0.75", "3/4", True),
        ("42.00005", "42", True),
        ("42.001", "42", False),
        (None, "42", False),
        ("42", None, False),
        ("42", 42, True),  # gold as a number
    ],
)
def test_answers_match(predicted, gold, expected):
    assert answers_match(predicted, gold) is expected


def test_a_huge_answer_is_wrong_not_an_error():
    # A collapsed run answered '#### 1000...0' (hundreds of digits): float(a - b) overflowed and the
    # reward raised instead of scoring it wrong.
    huge = "1" + "0" * 400
    assert answers_match(huge, "100") is False
    assert answers_match(huge, huge) is True
    assert correctness_reward(["q"], ["#### " + huge], answer=["100"]) == [0.0]


def test_correctness_reward_hand_worked():
    completions = [
        "Natalia sold 48 / 2 = 24 clips in May.\n48 + 24 = 72\n#### 72",  # right
        "48 + 24 = 72 clips in all.",  # right, only through the fallback
        "#### 73",  # wrong
        "The answer is \\boxed{72.0}",  # right, boxed, decimal spelling
        "",  # no answer
        "#### 72\nActually I meant 80",  # #### wins over the later number
    ]
    rewards = correctness_reward(["q"] * 6, completions, answer=["72"] * 6)
    assert rewards == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert correctness_reward(["q"], ["#### -2"], answer=["-2"], solution=["ignored"]) == [1.0]
    assert gsm8k.accuracy_reward is correctness_reward


def test_a_cut_completion_is_right_only_through_an_explicit_answer():
    """Cut at max_tokens, a ramble whose last number happens to be the gold one gave no answer."""
    completions = [
        "Bella bought 12 * (32 / 3) = 28 more stamps. So, 12 + 24 = 38 more rose",  # luck: last number 38
        "48 + 24 = 72 clips in all.",  # finished: the fallback reads 72
        "48 + 24 = 72\n#### 72\nThe answer is 72. Next question: Tom has 5 app",  # explicit, then cut
        "So the answer is \\boxed{72}. In a different problem, 45 days of",  # boxed, then cut
        "48 + 24 = 72\n#### 38\nWait, it is 72",  # cut: the #### answer decides, 38 is wrong
    ]
    gold = ["38", "72", "72", "72", "72"]
    reasons = ["length", "stop", "length", "length", "length"]
    assert correctness_reward(["q"] * 5, completions, answer=gold, finish_reason=reasons) == [
        0.0,
        1.0,
        1.0,
        1.0,
        0.0,
    ]
    assert correctness_reward(["q"] * 5, completions, answer=gold) == [
        1.0,
        1.0,
        1.0,
        1.0,
        0.0,
    ]  # reason unknown


def test_without_math_verify_expressions_are_not_evaluated():
    try:
        import math_verify  # noqa: F401
    except ImportError:
        # The fallback: the last number of the box is read, 7, not 6 x 7.
        assert correctness_reward(["q"], ["\\boxed{6 \\times 7}"], answer=["42"]) == [0.0]
    else:
        assert correctness_reward(["q"], ["\\boxed{6 \\times 7}"], answer=["42"]) == [1.0]
    assert math_answer._math_verify_match("6", "42") in (None, False)


def test_format_reward():
    completions = [
        "3 + 4 = 7\n#### 7",
        "3 + 4 = 7\n#### 7\n\n",  # trailing blank lines are fine
        "#### 1,234",
        "#### 7\nThat's it!",  # text after the answer line
        "The answer is 7.",
        "#### seven",
        "\\boxed{7}",
        "",
    ]
    assert format_reward(["q"] * 8, completions) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_math_verify_in_a_worker_thread_says_nothing(caplog):
    """Grading runs in worker threads, where math-verify's signal timeouts are off and it warns once a
    process; the length cap is the limit instead, so the user sees no warning (and still the right score)."""
    math_verify = pytest.importorskip("math_verify")
    import threading

    from math_verify import parser

    parser.TIMEOUT_WARNING_SHOWN = False  # as in a fresh process
    out = []
    with caplog.at_level(logging.WARNING):
        worker = threading.Thread(
            target=lambda: out.append(math_answer._math_verify_match("6 \\times 7", "42"))
        )
        worker.start()
        worker.join()
    assert out == [True]
    assert not [r for r in caplog.records if r.name.startswith("math_verify")]
    assert math_verify is not None
