"""The GSM8K task: answer extraction, the rewards, the offline data and the configs."""

import json
import logging
from pathlib import Path

import pytest
import yaml

from mlx_grpo.config import build_config, check_keys
from mlx_grpo.tasks import registry as tasks
from rewards import gsm8k, math_answer
from rewards.gsm8k import (
    answers_match,
    canonical_number,
    correctness_reward,
    extract_answer,
    format_reward,
    gold_answer,
)

REPO = Path(__file__).resolve().parents[1]
# CI checks the repo out with shared/ beside it.
GSM8K_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
needs_data = pytest.mark.skipif(
    not (GSM8K_DATA / "train.jsonl").is_file(), reason=f"offline GSM8K copy not found at {GSM8K_DATA}"
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
