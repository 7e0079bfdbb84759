"""OCaml tests written as one string of code: cut into top-level tests, tests of another type refused,
scored by the asserts that pass, through data and the trainer's reward."""

from __future__ import annotations

import pytest
from marks import needs_ocaml
from ocaml_problems import ALL, HAND_MADE, SUM_LIST, fenced

from rewards import ocaml
from rewards.ocaml import testcode

FIRST_ELEMENT = "let sum_list (xs : int list) : int =\n  match xs with [] -> 0 | x :: _ -> x"

# Each block with its tests as cut (expressions; setup code in brackets), and by hand, for
# the correct, positives-only ("partial") and first-element answers, the tests they pass.
BLOCKS = {
    "sequence": (
        "let () =\n  assert (sum_list [] = 0);\n  assert (sum_list [1;2] = 3)\n",
        ["assert (sum_list [] = 0)", "assert (sum_list [1;2] = 3)"],
        (2, 2, 1),
    ),
    "phrases": (
        "(* sum_list; the tests *)\nlet () = assert (sum_list [] = 0)\n"
        "let big = List.init 100 (fun i -> i)\nlet () = assert (sum_list big = 4950)\n"
        'let () = assert (sum_list [-5; 5; -1] = -1); assert (String.length "a;b" = 3)\n',
        [
            "assert (sum_list [] = 0)",
            "[let big = List.init 100 (fun i -> i)]",
            "assert (sum_list big = 4950)",
            "assert (sum_list [-5; 5; -1] = -1)",
            'assert (String.length "a;b" = 3)',
        ],
        (4, 3, 2),
    ),
    "bare": (
        "assert (sum_list [7] = 7);;\nassert (sum_list [1; 2; 3; 4] = 10);;\n",
        ["assert (sum_list [7] = 7)", "assert (sum_list [1; 2; 3; 4] = 10)"],
        (2, 2, 1),
    ),
    "unsplittable": (
        "let () =\n  let check xs n = assert (sum_list xs = n) in\n  check [] 0;\n  check [-5; 5; -1] (-1)\n",
        ["let check xs n = assert (sum_list xs = n) in\n  check [] 0;\n  check [-5; 5; -1] (-1)"],
        (1, 0, 0),
    ),
    # Code after the last test: reaching the end of the program is one more test.
    "setup_last": (
        "let () = assert (sum_list [] = 0)\nlet five = assert (sum_list [2; 3] = 5)\n",
        ["assert (sum_list [] = 0)", "[let five = assert (sum_list [2; 3] = 5)]", "()"],
        (2, 2, 1),
    ),
    "no_test_phrase": (
        'let check = sum_list\nlet six = if sum_list [1; 2; 3] <> 6 then failwith "sum"\n',
        ["[let check = sum_list]", '[let six = if sum_list [1; 2; 3] <> 6 then failwith "sum"]', "()"],
        (1, 1, 0),
    ),
}


def test_a_string_of_tests_is_cut_into_top_level_tests():
    for name, (block, expected, (total, _, _)) in BLOCKS.items():
        items = testcode.test_items(block)
        shown = [item.expression if isinstance(item, testcode.Test) else f"[{item}]" for item in items]
        assert shown == expected, name
        assert testcode.count_tests(block) == total, name
    # Comments, strings and characters as OCaml reads them: a quote in a comment, "*)" in a string.
    tricky = (
        "(* sum_list '\"' *) let () = assert (sum_list [] = 0)\n"
        '(* "*)" *)let () = assert (sum_list [1] = 1)\n'
        "let s = {|a\"b;|}\nlet () = assert ({x|;|x} = \";\"); assert (';' <> '\\'')"
    )
    assert [i.expression if isinstance(i, testcode.Test) else i for i in testcode.test_items(tricky)] == [
        "assert (sum_list [] = 0)",
        "assert (sum_list [1] = 1)",
        'let s = {|a"b;|}',
        'assert ({x|;|x} = ";")',
        "assert (';' <> '\\'')",
    ]
    for p in ALL:  # every shipped problem's tests, written three ways, give back its list
        for block in [
            "let () =\n" + ";\n".join("  " + t for t in p["tests"]) + "\n",
            "".join(f"let () = {t}\n" for t in p["tests"]),
            "".join(f"{t};;\n" for t in p["tests"]),
        ]:
            assert [i.expression for i in testcode.test_items(block)] == p["tests"], (p["id"], block)


BAD_TESTS = [
    (42, "not a number"),
    ({"a": "assert true"}, "not an object"),
    ([], "not an empty list"),
    (["assert true", 3], "not a list holding a number"),
    (None, "not null"),
    (["assert true", " "], "not a list holding an empty string"),
]


def test_tests_of_another_type_are_refused():
    for bad, says in BAD_TESTS:
        assert testcode.test_error(bad).endswith(says), bad
    assert "no OCaml code" in testcode.test_error("  (* nothing *)\n")
    assert testcode.test_error("assert true") is None and testcode.test_error(["assert true"]) is None


@needs_ocaml  # grading looks for the toolchain before it reads the tests
def test_grading_refuses_tests_of_another_type():
    for bad, _ in BAD_TESTS:
        with pytest.raises(ValueError, match="'tests' must be a non-empty list of OCaml assert expressions"):
            ocaml.grade("let sum_list xs = 0", dict(SUM_LIST, tests=bad))


@needs_ocaml
def test_a_string_of_tests_scores_by_top_level_asserts():
    answers = [HAND_MADE["correct"], HAND_MADE["partial"], FIRST_ELEMENT]
    for name, (block, _, (total, *passes)) in BLOCKS.items():
        problem = dict(SUM_LIST, tests=block)
        grades = ocaml.grade_many([fenced(a) for a in answers], [problem] * 3)
        assert [g.tests_total for g in grades] == [total] * 3, name
        assert [g.tests_passed for g in grades] == [total, *passes], (name, [g.error for g in grades])
        assert [g.score for g in grades] == pytest.approx([1.0] + [0.3 + 0.7 * k / total for k in passes]), (
            name
        )
    # The issue's example: 1.0 for a right answer (it was 0.2, with one "test" per character: 53).
    issue = "let () =\n  assert (f [] = 0);\n  assert (f [1;2] = 3)\n"
    g = ocaml.grade(
        "let f xs = List.fold_left ( + ) 0 xs", {"signature": "let f (xs : int list) : int =", "tests": issue}
    )
    assert (g.score, g.stage, g.tests_passed, g.tests_total) == (1.0, "passed", 2, 2)


@needs_ocaml
def test_every_reference_passes_its_tests_written_as_one_string():
    blocks = [dict(p, tests="let () =\n" + ";\n".join("  " + t for t in p["tests"]) + "\n") for p in ALL]
    grades = ocaml.grade_many([fenced(p["solution"]) for p in ALL], blocks)
    assert [(p["id"], g.score, g.tests_total) for p, g in zip(ALL, grades)] == [
        (p["id"], 1.0, len(p["tests"])) for p in ALL
    ]
    # Same stages and scores as the list form, answer by answer.
    as_string = dict(SUM_LIST, tests="".join(f"let () = {t}\n" for t in SUM_LIST["tests"]))
    completions = [fenced(c) for c in HAND_MADE.values()]
    from_string = ocaml.grade_many(completions, [as_string] * len(completions))
    from_list = ocaml.grade_many(completions, [SUM_LIST] * len(completions))
    assert [(g.stage, g.tests_passed, g.score) for g in from_string] == [
        (g.stage, g.tests_passed, g.score) for g in from_list
    ]


@needs_ocaml
def test_string_tests_through_data_and_the_trainers_reward(tmp_path):
    import json

    from typer.testing import CliRunner

    from mlx_grpo.cli import app
    from mlx_grpo.config import build_config
    from mlx_grpo.tasks import registry as tasks
    from mlx_grpo.tasks.rewarding import score_completions

    record = {key: SUM_LIST[key] for key in ("prompt", "signature", "preamble", "solution")}
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "train.jsonl").write_text(
        json.dumps(dict(record, id="seq", tests=BLOCKS["sequence"][0])) + "\n"
    )
    (folder / "test.jsonl").write_text(
        json.dumps(dict(record, id="one", tests=BLOCKS["unsplittable"][0])) + "\n"
    )
    task = tasks.base_task(
        build_config({"task": "ocaml", "data": str(folder)}, None, tasks.recommended_settings)
    )
    assert [r["tests"] for r in task.train_rows + task.test_rows] == [
        BLOCKS["sequence"][0],
        BLOCKS["unsplittable"][0],
    ]
    completions = [fenced(HAND_MADE["correct"]), fenced(FIRST_ELEMENT), fenced(HAND_MADE["type_error"])]
    for row, first_element in [(task.train_rows[0], 0.3 + 0.7 / 2), (task.test_rows[0], 0.3)]:
        columns = {k: [row[k]] * 3 for k in row if k != "prompt"}
        scores = score_completions(
            task.reward_functions + [task.accuracy_reward],
            task.reward_weights + [0.0],
            [row["prompt"]] * 3,
            completions,
            columns,
        )
        assert scores.errors == {}
        assert scores.parts["ocaml_reward"] == pytest.approx([1.0, first_element, 0.1]), row["id"]
        assert scores.parts["ocaml_passes"] == [1.0, 0.0, 0.0]
        assert list(scores.total) == pytest.approx([1.0, first_element, 0.1])
    # Tests of another type: one line naming the problem, exit 2, no traceback.
    (folder / "test.jsonl").write_text(json.dumps(dict(record, id="odd_one", tests=42)) + "\n")
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--task",
            "ocaml",
            "--data",
            str(folder),
            "--steps",
            "1",
            "--output",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "problem 'odd_one': 'tests' must be" in result.output and "Traceback" not in result.output
