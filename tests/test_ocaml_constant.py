"""A program that returns a constant earns nothing for the tests it passes by luck (rewards/ocaml, stage
"constant")."""

import json
from pathlib import Path

import pytest

from marks import needs_ocaml
from rewards import ocaml
from rewards.ocaml.source import assemble, ignores_its_input

DATA = Path(ocaml.__file__).resolve().parents[1] / "ocaml_data"


@pytest.mark.parametrize(
    "source, name, constant",
    [
        ("let fib (n : int) : int = 0", "fib", True),
        ("let last_elem (xs : 'a list) : 'a option = None", "last_elem", True),
        ("let all_satisfy (p : 'a -> bool) (xs : 'a list) : bool = true", "all_satisfy", True),
        ('let rev_s (s : string) : string = "Hello, World!"', "rev_s", True),
        (
            "let fib (n : int) : int =\n  let rec go a b k = if k = 0 then a else go b (a + b) (k - 1) in\n"
            "  go 0 1 n",
            "fib",
            False,
        ),
        (
            "let rec last_elem xs = match xs with [] -> None | [x] -> Some x | _ :: r -> last_elem r",
            "last_elem",
            False,
        ),
        ("let all_satisfy (p : 'a -> bool) (xs : 'a list) : bool = List.for_all p xs", "all_satisfy", False),
        ("let k (xs' : int list) : int = List.length xs'", "k", False),  # a primed name is its own word
        ("let h ~(x : int) (y : int) : int = x", "h", False),  # one parameter used is enough
        ("let f = function [] -> 0 | _ -> 1", "f", False),  # no named parameter: not judged
        ("let g (_ : int) : int = 3", "g", False),
    ],
)
def test_a_definition_that_names_none_of_its_parameters_is_a_constant(source, name, constant):
    assert ignores_its_input(source, name) == constant


def test_no_reference_solution_is_taken_for_a_constant():
    """The rule's false positives on real code: none of the 207 shipped reference solutions."""
    for split in ("train", "test"):
        for line in (DATA / f"{split}.jsonl").read_text().splitlines():
            problem = json.loads(line)
            name = ocaml.function_name(problem["signature"])
            assert not ignores_its_input(assemble(problem["solution"], problem["signature"]), name), problem[
                "id"
            ]


@needs_ocaml
def test_constants_score_nothing_and_honest_attempts_keep_their_credit():
    """Answers Qwen2.5-Coder-0.5B gave after 18 steps on lr 2e-5 would score 0.3-0.65 for the tests a constant
    passes; they score 0. A non-constant wrong answer keeps its partial credit, a right one 1."""
    fib = {
        "signature": "let fib (n : int) : int =",
        "preamble": "",
        "tests": [
            "assert (fib 0 = 0)",
            "assert (fib 1 = 1)",
            "assert (fib 10 = 55)",
            "assert (fib 20 = 6765)",
        ],
    }
    constant = "```ocaml\nlet fib (n : int) : int = 0\n```"
    wrong = "```ocaml\nlet fib (n : int) : int = n\n```"  # passes fib 0 and fib 1
    right = (
        "```ocaml\nlet fib (n : int) : int =\n"
        "  let rec go a b k = if k = 0 then a else go b (a + b) (k - 1) in\n  go 0 1 n\n```"
    )
    grades = ocaml.grade_many([constant, wrong, right], [fib] * 3)
    assert [g.stage for g in grades] == ["constant", "tests", "passed"]
    assert [g.score for g in grades] == [0.0, pytest.approx(0.3 + 0.7 * 2 / 4), 1.0]
    assert grades[0].tests_passed == 1  # it did pass one: the credit, not the count, is withheld
