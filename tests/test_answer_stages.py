"""compare's report counts an OCaml model's answers by the grading stage they reached, per model."""

import json

import pytest

from marks import needs_ocaml
from mlx_grpo import make_config
from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.evaluation.compare_report import prompt_records, table_rows
from mlx_grpo.run.task_setup import load_task
from rewards import ocaml

PROBLEM = {
    "signature": "let double (n : int) : int =",
    "preamble": "",
    "tests": [
        "assert (double 2 = 4)",
        "assert (double 0 = 0)",
        "assert (double 5 = 10)",
        "assert (double 7 = 14)",
    ],
}
RIGHT = "```ocaml\nlet double (n : int) : int = n * 2\n```"
WRONG = "```ocaml\nlet double (n : int) : int = n + 2\n```"  # builds, fails tests
NO_IN = "```ocaml\nlet double (n : int) : int =\n  let m = n * 2\n  m\n```"  # F#'s let without `in`: no parse
UNBOUND = "```ocaml\nlet double (n : int) : int = List.twice n\n```"  # no such function: a type error
BAD_MOD = "```ocaml\nlet double (n : int) : int = n % 2\n```"  # `%` is not OCaml's mod: a type error


@needs_ocaml
def test_each_answer_is_at_the_stage_it_reached():
    answers = [RIGHT, WRONG, NO_IN, UNBOUND, BAD_MOD]
    stages = ocaml.answer_stages(
        ["p"] * 5, answers, [PROBLEM["signature"]] * 5, [PROBLEM["tests"]] * 5, [""] * 5
    )
    assert stages == ["passed", "tests", "syntax_error", "type_error", "type_error"]


@pytest.fixture
def ocaml_task(tmp_path):
    def problem(i):
        return {
            "id": f"double-{i}",
            "difficulty": "easy",
            "topic": "arithmetic",
            "prompt": f"Double a number ({i}).",
            "solution": "let double (n : int) : int = n * 2",
            **PROBLEM,
        }

    for split, count in (("train", 20), ("test", 2)):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(problem(i)) + "\n" for i in range(count)))
    return load_task(
        make_config(task="ocaml", model="some-chat-model", data=str(tmp_path), eval_num_problems=2)
    )


@needs_ocaml
def test_the_report_shows_each_models_stages(ocaml_task, monkeypatch):
    """Base writes code that does not build, trained code that builds: the stage rows say so, per model."""
    made = {"base": [NO_IN, UNBOUND], "trained": [RIGHT, WRONG]}
    order = iter(made.values())

    def generate(model, tokenizer, task, rows, settings, on_progress=None):
        answers = [cmp.Answer(text, [1, 2], 2, "stop", False) for text in next(order)]
        return answers, answers, 0.1

    monkeypatch.setattr(cmp, "guard", lambda *a: None)  # no models to load: the answers are made above
    monkeypatch.setattr(cmp, "load_model", lambda *a: (None, None))
    monkeypatch.setattr(cmp, "generate", generate)
    report = cmp.compare(
        cmp.ModelSpec("base-model"), cmp.ModelSpec("trained-model"), ocaml_task, cmp.Settings()
    )

    models = report.data["models"]
    assert {s: v for s, v in models["base"]["stages"].items() if v} == {
        "syntax_error": 0.5,
        "type_error": 0.5,
    }
    assert {s: v for s, v in models["trained"]["stages"].items() if v} == {"tests": 0.5, "passed": 0.5}
    assert list(models["base"]["stages"]) == list(ocaml.STAGES)  # the ladder, bottom first, for both models
    _, rows = table_rows(report)
    shown = {row[0]: row[1:3] for row in rows if row[0].startswith("stage ")}
    assert shown == {
        "stage syntax_error": ["0.500", "0.000"],
        "stage type_error": ["0.500", "0.000"],
        "stage tests": ["0.000", "0.500"],
        "stage passed": ["0.000", "0.500"],
    }  # no one's stages: no row
    records = prompt_records(report)
    assert [r["base"]["stages"] for r in records] == [["syntax_error"], ["type_error"]]
    assert [r["trained"]["stages"] for r in records] == [["passed"], ["tests"]]


def test_a_task_without_a_ladder_has_no_stages(tiny_model_path, variety_task):
    task = load_task(make_config(model=str(tiny_model_path), **variety_task))
    answers = [cmp.Answer("x", [1], 1, "stop", False)] * 2
    assert cmp.answer_stages(task, task.eval_rows[:2], answers, 1) is None
