"""Held out means held out: splits fixed by the data, each run's record of its train rows, and the check
that `compare` and `eval` never score a model on a row any of its stages trained on."""

import json

import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import build_config
from mlx_grpo.models.loading import embedded_model_path
from mlx_grpo.run.sft import sft
from mlx_grpo.run.trainer import train
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import recommended_settings
from mlx_grpo.tasks.splits import TRAINED_ROWS, read_training_keys, row_key, side_of, split_held_out
from rewards.arith import generate_problems

needs_embedded = pytest.mark.skipif(
    not (embedded_model_path() / "config.json").exists(),
    reason="the embedded model has not been built (scripts/build_tiny_model.py)",
)


def _keys(rows):
    return {row_key(r) for r in rows}


def _arith_file(path, n=2000, seed=3, completion=False):
    """n arith rows of one seed; their prompts repeat (2,000 hold about 1,850 distinct ones)."""
    rows = generate_problems(n, seed=seed, split="train")
    with open(path, "w") as f:
        for r in rows:
            row = {"prompt": r["prompt"], "answer": r["answer"], "solution": r["solution"]}
            f.write(json.dumps({**row, "completion": r["solution"]} if completion else row) + "\n")
    return path


def _task(data, n, task="arith"):
    return load_task(
        build_config(
            {"task": task, "data": str(data), "eval_num_problems": n}, task_defaults=recommended_settings
        )
    )


def test_the_prompt_identifies_a_row_in_every_format():
    assert row_key({"prompt": "What is  2+2?\n"}) == row_key(
        {"prompt": [{"role": "user", "content": "What is 2+2?"}]}
    )
    assert row_key({"prompt": "What is 2+2?", "completion": "4"}) == row_key(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4"},
            ]
        }
    )
    assert row_key({"prompt": "What is 2+2?"}) != row_key({"prompt": "What is 2+3?"})
    # Conversations without a user turn are told apart by the whole conversation, not all taken for one.
    assert row_key({"messages": [{"role": "assistant", "content": "a"}]}) != row_key(
        {"messages": [{"role": "assistant", "content": "b"}]}
    )


def test_a_missing_split_is_carved_by_the_prompts_hash_and_repeats_land_together():
    rows = [{"prompt": f"question {i % 700}", "i": i} for i in range(2000)]  # every prompt two or three times
    train, validation, test = split_held_out(rows, None, None, [], "rows")
    assert len(train) + len(validation) + len(test) == 2000
    for split, name in ((train, "train"), (validation, "validation"), (test, "test")):
        assert {side_of(row_key(r)) for r in split} == {name}
    assert not _keys(train) & _keys(test) and not _keys(train) & _keys(validation)
    assert 0.05 < len(test) / 2000 < 0.15 and 0.05 < len(validation) / 2000 < 0.15
    # The order within a split is the data's.
    assert [r["i"] for r in test] == sorted(r["i"] for r in test)


def test_a_data_sets_own_splits_keep_a_repeated_prompt_on_one_side():
    train = [{"prompt": f"q{i}"} for i in range(50)]
    test = [{"prompt": "q3"}, {"prompt": "x"}]
    validation = [{"prompt": "q4"}, {"prompt": "x"}]  # "x" is a test row too
    warnings = []
    kept, validation, test = split_held_out(train, validation, test, warnings, "data")
    assert {"q3", "q4"}.isdisjoint(r["prompt"] for r in kept) and len(kept) == 48
    assert validation == [{"prompt": "q4"}] and len(test) == 2
    assert any("2 train rows" in w for w in warnings) and any("1 validation rows" in w for w in warnings)


def test_the_split_is_a_property_of_the_data_whatever_n(tmp_path):
    data = _arith_file(tmp_path / "rows.jsonl")
    tasks = {n: _task(data, n) for n in (50, 200, 400)}
    train = _keys(tasks[50].train_rows)
    for n, task in tasks.items():
        assert _keys(task.train_rows) == train  # eval_num_problems moves no row
        assert not _keys(task.test_rows) & train and not _keys(task.eval_rows) & train
        assert not _keys(task.test_rows) & _keys(task.eval_rows)
        assert len(task.test_rows) == min(n, len(tasks[400].test_rows))
    assert tasks[400].test_rows[:50] == tasks[50].test_rows  # --n takes the first N of one fixed split


def test_gsm8k_from_one_file_is_split_by_the_same_rule(tmp_path):
    rows = generate_problems(300, seed=5, split="train")
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(
        "".join(json.dumps({"question": r["prompt"], "answer": f"{r['solution']}"}) + "\n" for r in rows)
    )
    small, large = _task(data, 5, "gsm8k"), _task(data, 100, "gsm8k")
    assert _keys(small.train_rows) == _keys(large.train_rows)
    assert large.test_rows[:5] == small.test_rows and not _keys(large.test_rows) & _keys(large.train_rows)


def _train(data, run, model=None, steps=1):
    values = {
        "task": "arith",
        "data": str(data),
        "eval_num_problems": 50,
        "steps": steps,
        "batch_size": 2,
        "group_size": 2,
        "output": str(run),
        "eval_before": False,
        "max_tokens": 16,
    }
    if model:
        values["model"] = str(model)
    return train(build_config(values, task_defaults=recommended_settings))


def _scored(report_dir):
    return [json.loads(line) for line in (report_dir / "rows.jsonl").read_text().splitlines()]


@needs_embedded
def test_a_run_on_a_2000_row_file_is_never_scored_on_its_training_rows(tmp_path):
    data = _arith_file(tmp_path / "rows.jsonl")
    run = tmp_path / "run"
    _train(data, run)
    trained = read_training_keys(run)
    assert trained == _keys(_task(data, 50).train_rows)
    runner = CliRunner()
    for n in ("50", "200", "400"):
        out = tmp_path / f"compare-{n}"
        result = runner.invoke(
            app,
            [
                "compare",
                "--trained",
                str(run),
                "--n",
                n,
                "--max-tokens",
                "8",
                "--output",
                str(out),
                "--no-plot",
            ],
        )
        assert result.exit_code == 0, result.output
        scored = _scored(out)
        assert scored and not {row_key(r) for r in scored} & trained
    # Scoring it on rows it trained on (another file holding them) is refused in one line.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "train.jsonl").write_text('{"prompt": "unrelated", "answer": "1"}\n')
    (tmp_path / "other" / "test.jsonl").write_text(data.read_text())
    for command in (["compare", "--trained", str(run)], ["eval", "--model", str(run)]):
        result = runner.invoke(
            app,
            [
                *command,
                "--data",
                str(tmp_path / "other"),
                "--n",
                "30",
                "--max-tokens",
                "4",
                "--output",
                str(tmp_path / "refused"),
            ],
        )
        assert result.exit_code != 0
        assert "were training rows of" in result.output and str(run) in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
    # A run folder without the record gets a warning, not a refusal.
    (run / TRAINED_ROWS).unlink()
    result = runner.invoke(
        app, ["eval", "--model", str(run), "--n", "4", "--max-tokens", "4", "--output", str(tmp_path / "old")]
    )
    assert result.exit_code == 0, result.output
    assert "cannot be checked" in result.output


@needs_embedded
def test_sft_then_train_then_compare_never_scores_sfts_training_rows(tmp_path):
    data = _arith_file(
        tmp_path / "demos.jsonl", n=600, completion=True
    )  # demonstrations that train reads too
    sft_run, grpo_run = tmp_path / "sft", tmp_path / "grpo"
    sft(
        build_config(
            {
                "task": "custom",
                "data": str(data),
                "steps": 2,
                "batch_size": 4,
                "output": str(sft_run),
                "eval_before": False,
            }
        )
    )
    learned = read_training_keys(sft_run)
    held_out = _task(data, 1000)
    assert learned and not learned & (_keys(held_out.test_rows) | _keys(held_out.eval_rows))
    assert learned <= _keys(held_out.train_rows)
    _train(data, grpo_run, model=sft_run)
    out = tmp_path / "compare"
    result = CliRunner().invoke(
        app,
        [
            "compare",
            "--trained",
            str(grpo_run),
            "--n",
            "400",
            "--max-tokens",
            "8",
            "--output",
            str(out),
            "--no-plot",
        ],
    )
    assert result.exit_code == 0, result.output
    scored = {row_key(r) for r in _scored(out)}
    assert scored and not scored & learned and not scored & read_training_keys(grpo_run)
