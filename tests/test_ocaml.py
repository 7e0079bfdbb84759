"""The OCaml task: problem set, staged grading, runaway penalty, hostile code, wiring."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
from marks import needs_ocaml
from ocaml_problems import ALL, HAND_MADE, SUM_LIST, TEST, TRAIN, VALIDATION, fenced

from rewards import ocaml
from rewards.sandbox import Limits, capabilities

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------
# The problem set (no toolchain needed)


def test_code_extraction_and_joining():
    sig = "let rev_list (xs : int list) : int list ="
    text = (
        "Try:\n```python\nprint(1)\n```\nthen\n"
        "```ocaml\nlet helper x = x\n```\n```ocaml\nlet rec rev_list xs = xs\n```"
    )
    assert ocaml.extract_code(text, "rev_list") == "let rec rev_list xs = xs"
    assert ocaml.extract_code("let rev_list xs = xs\n", "rev_list") == "let rev_list xs = xs"
    assert ocaml.extract_code("```ocaml\nlet f x =\n  x", "f") == "let f x =\n  x"  # cut: no closing fence
    assert ocaml.assemble("let rev_list xs = xs", sig) == "let rev_list xs = xs"
    assert (
        ocaml.assemble("List.rev xs", sig) == "let rec rev_list (xs : int list) : int list =\n  List.rev xs"
    )
    assert ocaml.function_name("let rec f (x : int) : int =") == "f"


def test_runaway_detection():
    ok = fenced(SUM_LIST["solution"])
    assert ocaml.runaway_reason(ok) is None
    assert ocaml.runaway_reason(ok[: ok.rindex("```")]) == "cut"  # the closing fence never came
    assert ocaml.runaway_reason(ok, finish_reason="length") is None  # closed fence: not cut
    assert ocaml.runaway_reason("let f x = x", finish_reason="length") == "cut"
    assert ocaml.runaway_reason(ok + "Hope this helps!\n" * 6) == "repetitive"
    assert ocaml.runaway_reason(ok + "let x = 1 in " * 80) == "repetitive"  # one long looping line
    assert ocaml.runaway_reason(ok[: ok.rindex("```")], ocaml.TRAINING) is None  # the trainer penalises cuts
    for p in ALL:  # no reference solution looks degenerate
        assert not ocaml.is_repetitive(fenced(p["solution"])), p["id"]


def test_stage_weights_give_a_ladder():
    w = ocaml.StageWeights()
    values = [
        w.value("syntax_error", 0, 4),
        w.value("type_error", 0, 4),
        w.value("compile_error", 0, 4),
        w.value("tests", 0, 4),
        w.value("tests", 1, 4),
        w.value("tests", 3, 4),
        w.value("passed", 4, 4),
    ]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert values[0] == 0.0 and values[-1] == 1.0
    assert w.value("tests", 2, 4) == pytest.approx(0.3 + 0.7 * 0.5)


# ---------------------------------------------------------------------------
# Grading (needs the toolchain)


@pytest.fixture(scope="module")
def reference_grades():
    return ocaml.grade_many([fenced(p["solution"]) for p in ALL], ALL)


@needs_ocaml
def test_every_reference_solution_scores_1(reference_grades):
    failures = [(p["id"], g.stage, g.error) for p, g in zip(ALL, reference_grades) if g.score != 1.0]
    assert failures == []
    assert all(g.tests_passed == g.tests_total >= 4 for g in reference_grades)


@needs_ocaml
def test_each_test_can_fail():
    """The tests are not vacuous: a constant answer fails some of every problem's tests."""
    p = SUM_LIST
    g = ocaml.grade(fenced("let sum_list (xs : int list) : int = 0"), p)
    assert g.stage == "constant" and 0 < g.tests_passed < g.tests_total  # only sum_list [] = 0 passes
    assert g.score == 0.0  # and a constant earns nothing for it (test_ocaml_constant.py)


@needs_ocaml
def test_hand_made_completions_score_in_order():
    grades = ocaml.grade_many([fenced(c) for c in HAND_MADE.values()], [SUM_LIST] * len(HAND_MADE))
    by_name = dict(zip(HAND_MADE, grades))
    assert [g.stage for g in grades] == [
        "passed",
        "tests",
        "tests",
        "compile_error",
        "type_error",
        "syntax_error",
    ]
    assert by_name["partial"].tests_passed == 3 and by_name["wrong"].tests_passed == 0
    scores = [g.score for g in grades]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)  # a spread, no ties
    assert scores[0] == 1.0 and scores[-1] == 0.0
    assert by_name["type_error"].error.startswith("File ") and "Error" in by_name["type_error"].error
    assert np.std(scores) > 0.2


@needs_ocaml
def test_body_only_and_raw_completions_are_joined_with_the_signature():
    assert ocaml.score("  match xs with [] -> 0 | x :: r -> x + sum_list r", SUM_LIST) == 1.0
    assert ocaml.score("let sum_list xs = List.fold_left ( + ) 0 xs", SUM_LIST) == 1.0
    assert ocaml.grade("", SUM_LIST).stage == "no_code"


@needs_ocaml
def test_a_completion_may_repeat_the_given_types():
    p = next(p for p in ALL if p["id"] == "point_add")
    repeated = "type point = { x : int; y : int }\n\n" + p["solution"]
    assert ocaml.grade(fenced(repeated), p).stage == "passed"  # OCaml alone would say "defined twice"
    other = "type point = { x : float; y : float }\nlet point_add (p : point) (q : point) : point = p"
    assert ocaml.grade(fenced(other), p).stage == "compile_error"  # its own type: the tests do not fit


@needs_ocaml
def test_runaway_penalty_multiplies_and_is_configurable():
    correct = fenced(HAND_MADE["correct"])
    cut = correct[: correct.rindex("```")]
    partial_cut = fenced(HAND_MADE["partial"])[:-4]
    assert ocaml.score(cut, SUM_LIST) == pytest.approx(0.3)
    assert ocaml.score(partial_cut, SUM_LIST) == pytest.approx(0.3 * (0.3 + 0.7 * 3 / 4))  # ranking kept
    g = ocaml.grade(correct + "I hope this helps!\n" * 8, SUM_LIST)
    assert (g.runaway, g.base_score, g.score) == ("repetitive", 1.0, pytest.approx(0.3))
    assert ocaml.grade(correct, SUM_LIST, finish_reason="length").runaway is None  # the fence closed
    lenient = ocaml.GradeConfig(runaway_penalty=0.5, penalize_repetition=False)
    assert ocaml.score(cut, SUM_LIST, lenient) == pytest.approx(0.5)
    assert ocaml.score(correct + "I hope this helps!\n" * 8, SUM_LIST, lenient) == 1.0
    weights = ocaml.GradeConfig(weights=ocaml.StageWeights(type_error=0.4))
    assert ocaml.score(fenced(HAND_MADE["type_error"]), SUM_LIST, weights) == pytest.approx(0.4)


@needs_ocaml
def test_a_solution_cannot_redefine_equality_to_pass():
    for cheat in [
        "let ( = ) _ _ = true\nlet sum_list (xs : int list) : int = 0",
        "module Stdlib = struct let ( = ) _ _ = true end\nlet sum_list (xs : int list) : int = 0",
        'let () = print_endline "PASS 0"; print_endline "PASS 1"\nlet sum_list (xs : int list) : int = 0',
    ]:
        g = ocaml.grade(fenced(cheat), SUM_LIST)
        assert g.stage == "constant" and g.tests_passed == 1, cheat  # only sum_list [] = 0 holds


@needs_ocaml
def test_reward_functions_through_the_engine():
    from mlx_grpo.tasks.rewarding import score_completions

    rows = ocaml.load_rows("test", type("C", (), {"data": None, "model": "some/model"})())
    assert len(rows) == len(TEST)
    row = next(r for r in rows if r["preamble"])
    problem = next(p for p in TEST if p["id"] == row["id"])
    assert problem["signature"] in row["prompt"] and problem["prompt"] in row["prompt"]
    completions = [fenced(problem["solution"]), "Sorry, I cannot help.", fenced(problem["solution"])[:-4]]
    columns = {k: [row[k]] * 3 for k in row if k != "prompt"}
    fns = [fn for fn, _ in ocaml.REWARDS]
    assert ocaml.accuracy_reward in fns  # the pass rate is logged as a part (weight 0)
    scores = score_completions(fns, [1.0] + [0.0] * (len(fns) - 1), [row["prompt"]] * 3, completions, columns)
    assert scores.errors == {}
    assert scores.parts["ocaml_reward"] == [1.0, 0.0, 1.0]  # the trainer, not the reward, penalises cuts
    assert scores.parts["ocaml_compiles"] == [1.0, 0.0, 1.0]
    assert scores.parts["ocaml_passes"] == [1.0, 0.0, 1.0]
    assert scores.parts["ocaml_runaway"] == [0.0, 0.0, 0.0]
    assert list(scores.total) == [1.0, 0.0, 1.0]


# ---------------------------------------------------------------------------
# Hostile completions are contained


HOSTILE = {
    "infinite_loop": "let rec sum_list (xs : int list) : int = sum_list xs",
    "allocate_10_gb": "let sum_list (xs : int list) : int = Bytes.length (Bytes.create 10_000_000_000)",
    "print_1_gb": "let () = for _ = 1 to 1_000_000 do print_string (String.make 1024 'x') done\n"
    "let sum_list (xs : int list) : int = 0",
    "stack_overflow": "let rec sum_list (xs : int list) : int = 1 + sum_list (0 :: xs)",
    # OCaml needs the Unix library for these, which the grader does not link:
    "fork_bomb": (
        "let rec bomb () = ignore (Unix.fork ()); bomb ()\nlet sum_list (xs : int list) : int = bomb (); 0"
    ),
    "socket": (
        "let sum_list (xs : int list) : int =\n  ignore (Unix.socket Unix.PF_INET Unix.SOCK_STREAM 0); 0"
    ),
}


@needs_ocaml
def test_hostile_completions_are_contained():
    tag = uuid.uuid4().hex
    outside = f"/tmp/ocaml-escape-{tag}"
    hostile = dict(
        HOSTILE,
        write_outside=f'let () = let oc = open_out "{outside}" in output_string oc "x"; '
        f"close_out oc\nlet sum_list (xs : int list) : int = 0",
    )
    before = set(os.listdir("/tmp"))
    tight = ocaml.GradeConfig(run_limits=Limits(cpu_s=1, wall_s=3, memory_mb=512, file_mb=1, processes=8))
    grades = dict(
        zip(
            hostile,
            ocaml.grade_many(
                [fenced(c) for c in hostile.values()], [SUM_LIST] * len(hostile), tight, workers=2
            ),
        )
    )
    assert grades["infinite_loop"].stage == "tests" and grades["infinite_loop"].tests_passed == 0
    assert grades["infinite_loop"].error  # "timed out", or killed at the CPU limit
    assert grades["allocate_10_gb"].tests_passed == 0  # Out_of_memory is a failed test, not a crash
    assert grades["print_1_gb"].error == "too much output" and grades["print_1_gb"].tests_passed == 0
    assert grades["stack_overflow"].tests_passed == 0
    assert grades["fork_bomb"].stage == "compile_error" and "Unix" in grades["fork_bomb"].error
    assert grades["socket"].stage == "compile_error"
    assert grades["write_outside"].stage in ("tests", "constant")  # it ran (and may have written)...
    assert not {n for n in set(os.listdir("/tmp")) - before if n.startswith("ocaml-grade-")}
    if capabilities().drop_uid:  # containment that needs a fresh uid (root)
        assert not os.path.exists(outside)  # ...but nothing is left
        assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_sandbox_process(pid)]
    elif os.path.exists(outside):
        os.unlink(outside)


def _is_sandbox_process(pid: str) -> bool:
    """A live process still running a graded program (./main) or the compiler from a sandbox."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
    except OSError:
        return False
    return b"./main" in cmd and "State:\tZ" not in status


# ---------------------------------------------------------------------------
# Wiring: toolchain message, task registration, config, CI


def test_missing_toolchain_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ValueError) as info:
        ocaml.require_toolchain()
    message = str(info.value)
    assert "\n" not in message and "apt-get install ocaml-nox" in message and "brew install ocaml" in message
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    result = CliRunner().invoke(
        app, ["train", "--task", "ocaml", "--steps", "1", "--output", str(tmp_path / "r")]
    )
    assert result.exit_code == 2, result.output
    assert "apt-get install ocaml-nox" in result.output and "Traceback" not in result.output


@needs_ocaml
def test_task_is_registered_and_the_config_file_validates():
    from mlx_grpo.config import build_config
    from mlx_grpo.tasks import registry as tasks

    assert tasks.BUILTIN_TASKS["ocaml"] == "rewards.ocaml"
    config = build_config({"task": "ocaml"}, None, tasks.recommended_settings)
    task = tasks.base_task(config)
    assert len(task.train_rows) == len(TRAIN)
    # The run's own before/after check takes the validation split's first eval_num_problems (at most 109).
    assert config.eval_num_problems < len(TEST)
    assert [r["id"] for r in task.eval_rows] == [p["id"] for p in VALIDATION[: config.eval_num_problems]]
    assert [r["id"] for r in task.test_rows] == [p["id"] for p in TEST[: config.eval_num_problems]]
    assert task.train_rows[0]["prompt"].startswith("let ")  # the tiny model's compact prompt
    assert task.reward_weights == [
        1.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ]  # the score; compiles, runaway, constant and passes only logged
    yaml_config = build_config({}, str(ROOT / "configs" / "ocaml.yaml"), tasks.recommended_settings)
    assert (
        yaml_config.task == "ocaml"
        and yaml_config.max_grad_norm == 1.0
        and yaml_config.runaway_penalty == 0.3
    )


def test_ci_installs_ocaml_when_missing(tmp_path):
    """Run the install step of .ci/run with no ocaml on PATH and a stand-in apt-get."""
    script = (ROOT / ".ci" / "run").read_text()
    block = re.search(r"^if ! command -v ocaml .*?^fi$", script, re.M | re.S)
    assert block, ".ci/run has no OCaml install step"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_dir / "apt-get").chmod(0o755)
    result = subprocess.run(
        ["/bin/sh", "-c", block.group(0)], env={"PATH": str(bin_dir)}, capture_output=True
    )
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[-1].split()[-1] == "ocaml-nox" and "install" in calls[-1] and "-y" in calls[-1]
    # With the toolchain present, nothing is installed.
    for tool in ("ocaml", "ocamlc"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
        (bin_dir / tool).chmod(0o755)
    log.unlink()
    subprocess.run(["/bin/sh", "-c", block.group(0)], env={"PATH": str(bin_dir)}, check=True)
    assert not log.exists()


@needs_ocaml
def test_own_problems_through_data(tmp_path):
    import json

    records = [dict(p, id=f"p{i}") for i, p in enumerate(TRAIN[:20])]
    single = tmp_path / "mine.jsonl"
    single.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = type("C", (), {"data": str(single), "model": "some/model", "eval_num_problems": 200})()
    train, test = ocaml.load_rows("train", config), ocaml.load_rows("test", config)
    # One file is all train rows: the registry carves its held-out splits by each prompt's hash
    # (tasks/splits.py).
    assert [r["id"] for r in train] == [f"p{i}" for i in range(20)] and test == []
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "train.jsonl").write_text(json.dumps(records[0]) + "\n")
    (folder / "test.jsonl").write_text(json.dumps(dict(records[1], tests={"a": "assert true"})) + "\n")
    config.data = str(folder)
    assert ocaml.load_rows("train", config)[0]["signature"] == records[0]["signature"]
    with pytest.raises(ValueError, match=r"test.jsonl:1: problem 'p1': 'tests' must be a non-empty list"):
        ocaml.load_rows("test", config)
