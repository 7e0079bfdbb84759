"""Train, validation and test: disjoint for every built-in task; a run checks itself on validation only;
`compare --data FILE` reads web task rows (scripts/web_tasks.py writes them)."""

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import ConfigError, build_config
from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import recommended_settings
from mlx_grpo.tasks.splits import row_key, side_of
from rewards import arith
from tests.marks import needs_ocaml

ROOT = Path(__file__).resolve().parents[1]
GSM8K_DATA = ROOT.parent / "shared" / "data" / "gsm8k"
# What tells two rows apart in each task.
KEYS = {
    "arith": "prompt",
    "web": "task_id",
    "multihop": "id",
    "ocaml": "id",
    "gsm8k": "prompt",
    "custom": "prompt",
}


def _task(name, **settings):
    return load_task(build_config({"task": name, **settings}, None, recommended_settings))


def _keys(task, rows):
    return [r[KEYS[task.name]] for r in rows]


def _assert_three_disjoint_splits(task):
    train, validation, test = (
        set(_keys(task, rows)) for rows in (task.train_rows, task.eval_rows, task.test_rows)
    )
    assert validation and test
    assert not validation & test and not validation & train and not test & train


@pytest.mark.parametrize("name", ["arith", "web", "multihop"])
def test_generated_tasks_have_disjoint_validation_and_test(name):
    task = _task(name, eval_num_problems=24)
    _assert_three_disjoint_splits(task)
    assert len(task.eval_rows) == len(task.test_rows) == 24
    assert cmp.select_rows(task, "validation", None) == task.eval_rows
    assert cmp.select_rows(task, "test", None) == task.test_rows


def test_arith_validation_is_the_held_out_stream_a_run_checks_on_and_test_follows_it():
    task = _task("arith", eval_num_problems=200)
    stream = arith.generate_problems(arith.ARITH_VALIDATION_PROBLEMS + 200, seed=0, split="test")
    # The default run's before/after check reads these very rows.
    assert _keys(task, task.eval_rows) == [p["prompt"] for p in stream[:200]]
    assert _keys(task, task.test_rows) == [p["prompt"] for p in stream[arith.ARITH_VALIDATION_PROBLEMS :]]


@needs_ocaml
def test_ocaml_validation_is_the_test_files_first_109_problems_and_test_the_other_300():
    from rewards import ocaml

    held_out = [
        json.loads(line)["id"]
        for line in (ocaml.DATA_DIR / "test.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert len(held_out) == 409
    validation, test = ocaml.problems("validation"), ocaml.problems("test")
    assert [p["id"] for p in validation] == held_out[:109] and [p["id"] for p in test] == held_out[109:]
    task = _task("ocaml", eval_num_problems=400)
    assert (len(task.eval_rows), len(task.test_rows)) == (109, 300)
    _assert_three_disjoint_splits(task)


@pytest.mark.skipif(not (GSM8K_DATA / "train.jsonl").is_file(), reason="offline GSM8K copy not found")
def test_gsm8k_validation_is_carved_from_train():
    task = _task("gsm8k", data=str(GSM8K_DATA), eval_num_problems=50)
    _assert_three_disjoint_splits(task)
    train_file = [
        json.loads(line)["question"] for line in (GSM8K_DATA / "train.jsonl").read_text().splitlines()
    ]
    carved = [q.strip() for q in train_file if side_of(row_key({"prompt": q.strip()})) == "validation"]
    assert [r["prompt"] for r in task.eval_rows] == carved[
        :50
    ]  # the share's first rows, whatever eval_num_problems
    assert 0.08 < len(carved) / len(train_file) < 0.12
    assert any("no validation split" in w for w in task.warnings)


def test_own_data_file_gives_a_fixed_hashed_share_of_its_rows_to_test_and_validation(tmp_path):
    rows = [{"prompt": f"question {i}", "answer": str(i)} for i in range(100)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reward = tmp_path / "reward.py"
    reward.write_text(
        "def exact(prompts, completions, answer, **kw):\n"
        "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n"
    )
    task = _task("custom", data=str(data), reward_file=str(reward), reward=["exact"], eval_num_problems=5)
    side = {r["prompt"]: side_of(row_key(r)) for r in rows}
    assert _keys(task, task.test_rows) == [p for p, s in side.items() if s == "test"][:5]
    assert _keys(task, task.eval_rows) == [p for p, s in side.items() if s == "validation"][:5]
    assert _keys(task, task.train_rows) == [p for p, s in side.items() if s == "train"]
    (tmp_path / "folder").mkdir()
    for name, part in (("train", rows[:80]), ("valid", rows[80:90]), ("test", rows[90:])):
        (tmp_path / "folder" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    task = _task(
        "custom",
        data=str(tmp_path / "folder"),
        reward_file=str(reward),
        reward=["exact"],
        eval_num_problems=20,
    )
    assert (len(task.train_rows), len(task.eval_rows), len(task.test_rows)) == (80, 10, 10)
    assert task.eval_rows[0]["prompt"] == "question 80" and task.test_rows[0]["prompt"] == "question 90"


def test_split_flag_takes_validation_and_refuses_others():
    config = build_config({"task": "arith"}, None, recommended_settings)
    assert cmp.build_settings(config, split="validation").split == "validation"
    with pytest.raises(cmp.CompareError, match="--split must be one of test, validation, train"):
        cmp.build_settings(config, split="dev")


# ---------------------------------------------------------------------------
# Web task files


def _web_tasks_script():
    spec = importlib.util.spec_from_file_location("web_tasks", ROOT / "scripts" / "web_tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_web_tasks_script_writes_every_kind_and_compare_reads_them_as_the_test_split(tmp_path):
    out = tmp_path / "held_out.jsonl"
    assert _web_tasks_script().main(["--seeds", "1000-1007", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 96 and {r["seed"] for r in rows} == set(range(1000, 1008))
    assert {(r["family"], r["difficulty"]) for r in rows[:12]} == {
        (f, d) for f in ("fact", "shop", "travel", "account") for d in (1, 2, 3)
    }
    task = _task("web", data=str(out), eval_num_problems=96)
    assert [(r["family"], r["difficulty"], r["seed"]) for r in task.test_rows] == [
        (r["family"], r["difficulty"], r["seed"]) for r in rows
    ]
    assert task.test_rows[0]["task_id"] == f"{rows[0]['family']}-{rows[0]['difficulty']}-{rows[0]['seed']}"
    from rewards.web_browsing import make_task

    assert (
        task.test_rows[5]["prompt"]
        == make_task(rows[5]["family"], rows[5]["difficulty"], rows[5]["seed"]).instruction
    )
    # The run's own check stays on generated validation tasks; training never meets a file's task.
    assert not {r["task_id"] for r in task.train_rows} & {r["task_id"] for r in task.test_rows}
    assert not {r["task_id"] for r in task.eval_rows} & {r["task_id"] for r in task.test_rows}


def test_web_tasks_script_refuses_bad_seeds(tmp_path, capsys):
    assert _web_tasks_script().main(["--seeds", "ten", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "--seeds" in capsys.readouterr().err and not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize(
    "row, message",
    [
        (
            {"family": "fact", "seed": 3},
            r"rows.jsonl:2: .*needs 'family', 'difficulty' and 'seed' \(no 'difficulty'\)",
        ),
        ({"family": "cooking", "difficulty": 1, "seed": 3}, r"rows.jsonl:2: unknown family 'cooking'"),
        ({"family": "shop", "difficulty": 4, "seed": 3}, r"rows.jsonl:2: unknown difficulty 4"),
        ({"family": "shop", "difficulty": 1, "seed": "x"}, r"rows.jsonl:2: seed must be a whole number"),
    ],
)
def test_bad_web_task_row_is_one_line_naming_it(tmp_path, tiny_model_path, row, message):
    data = tmp_path / "rows.jsonl"
    data.write_text(
        json.dumps({"family": "fact", "difficulty": 1, "seed": 1}) + "\n" + json.dumps(row) + "\n"
    )
    with pytest.raises(ConfigError, match=message):
        _task("web", data=str(data))
    result = CliRunner().invoke(
        app,
        [
            "compare",
            "--trained",
            str(tiny_model_path),
            "--base",
            str(tiny_model_path),
            "--task",
            "web",
            "--data",
            str(data),
        ],
    )
    assert result.exit_code != 0 and "rows.jsonl:2:" in result.output and "Traceback" not in result.output
