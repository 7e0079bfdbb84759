"""The GSM8K task: its protocol, the offline data and the configs (answers and rewards:
tests/test_gsm8k_answers.py)."""

import json
from pathlib import Path

import pytest
import yaml

from mlx_grpo.config import build_config, check_keys
from mlx_grpo.tasks import registry as tasks
from rewards import gsm8k
from rewards.gsm8k import (
    canonical_number,
    correctness_reward,
    format_reward,
    gold_answer,
)

REPO = Path(__file__).resolve().parents[1]
# CI checks the repo out with shared/ beside it.
GSM8K_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
needs_data = pytest.mark.skipif(
    not (GSM8K_DATA / "train.jsonl").is_file(), reason=f"offline GSM8K copy not found at {GSM8K_DATA}"
)


def test_task_protocol():
    assert "####" in gsm8k.SYSTEM_PROMPT
    names = [fn.__name__ for fn, _ in gsm8k.REWARDS]
    assert names == ["correctness_reward", "format_reward"]
    weights = dict(zip(names, [w for _, w in gsm8k.REWARDS]))
    assert weights["correctness_reward"] == 1.0 and 0 <= weights["format_reward"] < 0.5
    settings = gsm8k.recommended_settings("Qwen/Qwen2.5-0.5B-Instruct")
    assert settings["max_tokens"] == 512
    check_keys(settings, "gsm8k recommended settings")  # only real TrainConfig fields
    assert tasks.recommended_settings("gsm8k", None) == gsm8k.recommended_settings(None)


def test_gold_answer():
    assert gold_answer("He paid 1,000 + 200 = <<1000+200=1200>>1,200.\n#### 1,200") == "1200"
    assert gold_answer("#### -5") == "-5"
    with pytest.raises(ValueError):
        gold_answer("no marker here")
    with pytest.raises(ValueError):
        gold_answer("#### twelve")


class _Config:
    """Just the fields load_rows reads."""

    def __init__(self, data, eval_num_problems=200):
        self.data, self.eval_num_problems = data, eval_num_problems


def test_a_single_file_is_all_train_rows_and_the_engine_carves_its_held_out_splits(tmp_path):
    path = tmp_path / "mine.jsonl"
    records = [
        {"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1:,}"}
        for i in range(1000, 1030)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "\n")
    train = gsm8k.load_rows("train", _Config(str(path)))
    assert len(train) == 30 and gsm8k.load_rows("test", _Config(str(path))) == []
    assert train[-1] == {"prompt": "What is 1029 + 1?", "answer": "1030", "solution": records[-1]["answer"]}
    task = tasks.base_task(
        build_config({"task": "gsm8k", "data": str(path)}, task_defaults=tasks.recommended_settings)
    )
    held_out = {r["prompt"] for r in task.test_rows + task.eval_rows}
    assert held_out and held_out.isdisjoint(r["prompt"] for r in task.train_rows)
    assert len(task.train_rows) + len(held_out) == 30


def test_load_rows_reports_bad_data(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 3"}\n{"question": "q2", "answer": "no marker"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no '####'"):
        gsm8k.load_rows("train", _Config(str(bad)))
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="malformed JSON"):
        gsm8k.load_rows("train", _Config(str(bad)))
    with pytest.raises(ValueError, match="not found"):
        gsm8k.load_rows("train", _Config(str(tmp_path / "missing.jsonl")))
    with pytest.raises(ValueError, match="no test.jsonl"):
        (tmp_path / "folder").mkdir()
        (tmp_path / "folder" / "train.jsonl").write_text('{"question": "q", "answer": "#### 3"}\n')
        gsm8k.load_rows("test", _Config(str(tmp_path / "folder")))


def test_hub_failure_is_a_clear_value_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub\nsecond line")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(
        ValueError,
        match=r"could not load the dataset 'openai/gsm8k' \(ConnectionError: Couldn't reach the Hub\)",
    ):
        gsm8k.load_rows("train", _Config(None))


def test_hub_rows_are_mapped(monkeypatch):
    import datasets

    calls = []

    def fake(name, subset=None):
        calls.append((name, subset))
        return {"train": [{"question": "q", "answer": "2 * 3 = 6\n#### 6"}], "test": []}

    monkeypatch.setattr(datasets, "load_dataset", fake)
    assert gsm8k.load_rows("train", _Config(None)) == [
        {"prompt": "q", "answer": "6", "solution": "2 * 3 = 6\n#### 6"}
    ]
    assert calls == [("openai/gsm8k", "main")]


@needs_data
def test_gold_answers_of_real_rows_parse():
    with open(GSM8K_DATA / "test.jsonl", encoding="utf-8") as f:
        records = [json.loads(next(f)) for _ in range(20)]
    for record in records:
        gold = gold_answer(record["answer"])
        assert canonical_number(gold) == gold
        # the reference solution, given as a completion, earns full reward
        assert correctness_reward([record["question"]], [record["answer"]], answer=[gold]) == [1.0]
        assert format_reward([record["question"]], [record["answer"]]) == [1.0]
    assert gold_answer(records[0]["answer"]) == "18"  # Janet's ducks


@needs_data
def test_load_rows_offline_folder():
    config = _Config(str(GSM8K_DATA))
    train, test = gsm8k.load_rows("train", config), gsm8k.load_rows("test", config)
    assert (len(train), len(test)) == (7473, 1319)
    for row in train + test:
        assert row["prompt"].strip() and canonical_number(row["answer"]) == row["answer"]
    assert any(r["answer"].startswith("-") for r in train)
    assert any("," in r["solution"].rsplit("####", 1)[1] for r in test)  # commas were stripped


@needs_data
def test_load_task_through_the_engine():
    task = tasks.base_task(
        build_config({"task": "gsm8k", "data": str(GSM8K_DATA)}, task_defaults=tasks.recommended_settings)
    )
    # Validation (the run's check) is the train.jsonl rows whose question hashes into its 10% share; test is
    # test.jsonl's first rows; train the rest, without a question of either.
    assert task.name == "gsm8k" and 6500 < len(task.train_rows) < 6900
    assert len(task.eval_rows) == len(task.test_rows) == 200  # eval_num_problems from recommended_settings
    held_out = {r["prompt"] for r in task.eval_rows + task.test_rows}
    assert held_out.isdisjoint(r["prompt"] for r in task.train_rows)
    assert task.system_prompt == gsm8k.SYSTEM_PROMPT
    row = task.eval_rows[0]
    completion = f"Let me work it out step by step.\n#### {row['answer']}"
    scores = [
        fn([row["prompt"]], [completion], answer=[row["answer"]], solution=[row["solution"]])
        for fn in task.reward_functions
    ]
    assert scores == [[1.0], [1.0]]
    assert task.accuracy_reward([row["prompt"]], [completion], answer=[row["answer"]]) == [1.0]
    overridden = tasks.base_task(
        build_config({"task": "gsm8k", "data": str(GSM8K_DATA), "system_prompt": "Be brief."})
    )
    assert overridden.system_prompt == "Be brief."


def test_cispo_config_follows_seed_000():
    values = yaml.safe_load((REPO / "configs" / "gsm8k_cispo.yaml").read_text())
    check_keys(values, "gsm8k_cispo.yaml")  # every key is a TrainConfig field
    assert values == {
        **values,
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "task": "gsm8k",
        "loss": "cispo",
        "epsilon_high": 0.28,
        "lr": 1e-5,
        "temperature": 1.0,
        "max_grad_norm": 1.0,
        "scale_rewards": "none",
        "eval_steps": 100,
        "eval_num_problems": 500,
        "steps": 500,
    }


def test_grpo_config_is_accepted():
    config = build_config(
        {}, str(REPO / "configs" / "gsm8k_grpo.yaml"), task_defaults=tasks.recommended_settings
    )
    assert (config.task, config.objective.loss, config.model) == (
        "gsm8k",
        "grpo",
        "Qwen/Qwen2.5-0.5B-Instruct",
    )
    assert (
        config.sampling.max_tokens == 512
        and config.group_size == 8
        and config.objective.scale_rewards == "none"
    )


def test_cispo_config_builds():
    config = build_config(
        {}, str(REPO / "configs" / "gsm8k_cispo.yaml"), task_defaults=tasks.recommended_settings
    )
    assert (config.objective.loss, config.objective.epsilon_high, config.objective.scale_rewards) == (
        "cispo",
        0.28,
        "none",
    )


@needs_data
def test_short_run_on_a_tiny_model(tmp_path, tiny_model_path):
    """End to end on the local data with the seed-000 objective; learning is not expected."""
    from mlx_grpo.run.trainer import train

    run = tmp_path / "run"
    config = build_config(
        {
            "task": "gsm8k",
            "model": str(tiny_model_path),
            "data": str(GSM8K_DATA),
            "loss": "cispo",
            "epsilon_high": 0.28,
            "steps": 2,
            "batch_size": 2,
            "group_size": 2,
            "max_tokens": 12,
            "eval_steps": 1,
            "eval_num_problems": 3,
            "eval_pass_k": 2,
            "output": str(run),
        },
        task_defaults=tasks.recommended_settings,
    )
    result = train(config)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2, 2]  # before training, the steps, the final evaluation
    assert metrics[0]["before"] and 0 <= metrics[0]["eval/pass@2"] <= 1
    assert 0 <= metrics[1]["eval/accuracy"] <= 1 and 0 <= metrics[1]["eval/pass@2"] <= 1
    assert {"reward/correctness_reward/mean", "reward/format_reward/mean"} <= metrics[1].keys()
    assert metrics[-1]["final"] and "eval/pass@2" in metrics[-1]
    assert result.eval_n == 3 and (run / "adapters.safetensors").is_file()
