"""Tasks as a chat model sees them: the answer form it is told, the scorer that reads that form,
the settings it is recommended, and eval/compare using the prompt a run trained with."""

import json

import pytest
from typer.testing import CliRunner

from marks import needs_ocaml
from mlx_grpo.cli import app
from mlx_grpo.config import build_config
from mlx_grpo.models.loading import embedded_model_path
from mlx_grpo.run.trainer import train
from mlx_grpo.tasks import registry
from rewards import arith, gsm8k
from test_gsm8k import GSM8K_DATA

CHAT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # only its name is read here


@pytest.mark.parametrize(
    "model, chat",
    [
        (None, False),
        ("", False),
        ("embedded", False),
        (str(embedded_model_path()), False),
        (CHAT_MODEL, True),
        ("smollm2-135m", True),
        ("/some/folder", True),
    ],
)
def test_which_models_are_chat_models(model, chat):
    assert registry.is_chat_model(model) is chat


@pytest.mark.parametrize(
    "text, expected",
    [
        ("7", "7"),
        ("7.", "7"),
        ("The answer is 12 apples.", "12"),
        ("3 + 4 = 7", "7"),
        ("He has 1,234 coins", "1234"),
        ("x = -4", "-4"),
        ("5-3", "3"),
        ("2.5 kg", "2.5"),
        ("no number", None),
        ("", None),
        ("#### 9", "9"),
    ],
)
def test_last_number(text, expected):
    assert arith.last_number(text) == expected


def test_arith_chat_scorer_reads_the_last_number():
    answers = ["4", "4", "4", "4", "10"]
    completions = ["4", "Tom has 7 - 3 = 4 apples left.", "#### 4", "4 apples, not 5", "ten"]
    assert arith.last_number_reward([""] * 5, completions, answer=answers) == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_embedded_model_keeps_its_settings_and_prompt():
    """The default run's settings, prompt and scorer stay as the embedded model was tuned for."""
    for model in (None, str(embedded_model_path())):
        assert arith.recommended_settings(model) == {
            "max_tokens": 48,
            "lr": 1e-4,
            "steps": 100,
            "batch_size": 8,
            "group_size": 8,
            "warmup_steps": 3,
            "micro_batch_size": 64,
            "save_every": 50,
        }
        task = registry.base_task(build_config({"model": model}, task_defaults=registry.recommended_settings))
        assert task.system_prompt is None
        assert [f.__name__ for f in task.reward_functions] == ["correctness_reward", "format_reward"]
        assert task.accuracy_reward is arith.correctness_reward


def test_a_chat_model_is_told_the_answer_form_and_scored_on_it():
    config = build_config({"model": CHAT_MODEL}, task_defaults=registry.recommended_settings)
    assert config.system_prompt == arith.CHAT_SYSTEM_PROMPT  # recorded in the run's config.yaml
    assert config.sampling.temperature < 1.0 and config.lr == 3e-5
    task = registry.base_task(config)
    assert task.system_prompt == "Answer with only the final number."
    assert (
        task.reward_functions == [arith.last_number_reward]
        and task.accuracy_reward is arith.last_number_reward
    )
    row = task.eval_rows[0]
    assert task.accuracy_reward([row["prompt"]], [row["answer"]], answer=[row["answer"]]) == [1.0]
    # the embedded model's form is still read; a chat model need not use it
    assert task.accuracy_reward([row["prompt"]], [f"#### {row['answer']}"], answer=[row["answer"]]) == [1.0]
    # a configuration built without the recommended settings gets the same prompt
    assert registry.base_task(build_config({"model": CHAT_MODEL})).system_prompt == arith.CHAT_SYSTEM_PROMPT
    # a typed prompt wins
    typed = build_config(
        {"model": CHAT_MODEL, "system_prompt": "Be brief."}, task_defaults=registry.recommended_settings
    )
    assert registry.base_task(typed).system_prompt == "Be brief."


@pytest.mark.parametrize("task_name", ["arith", "gsm8k", pytest.param("ocaml", marks=needs_ocaml), "web"])
def test_every_task_tells_a_chat_model_its_answer_form(task_name):
    settings = registry.recommended_settings(task_name, CHAT_MODEL)
    if task_name == "gsm8k" and not (GSM8K_DATA / "test.jsonl").is_file():
        pytest.skip("shared GSM8K data not found")
    data = str(GSM8K_DATA) if task_name == "gsm8k" else None
    config = build_config(
        {"model": CHAT_MODEL, "task": task_name, "data": data}, task_defaults=registry.recommended_settings
    )
    task = registry.base_task(config)
    assert task.system_prompt, task_name
    assert settings.get("system_prompt", task.system_prompt) == task.system_prompt
    form = {"arith": "final number", "gsm8k": "####", "ocaml": "```ocaml", "web": "one action"}[task_name]
    assert form in task.system_prompt


def test_gsm8k_chat_scorer_accepts_the_forms_a_chat_model_writes():
    completions = [
        "so 42 in all.\n#### 42",
        "The answer is \\boxed{42}.",
        "<answer>42</answer>",
        "It makes 42.",
    ]
    assert gsm8k.correctness_reward([""] * 4, completions, answer=["42"] * 4) == [1.0] * 4


# ---------------------------------------------------------------------------
# eval and compare take train's prompt options, and a run's own settings


@pytest.fixture(scope="module")
def run_with_a_prompt(tmp_path_factory):
    """A one-step run of the embedded model with a system prompt of its own (lr 1e-9: the adapters barely
    move).

    The embedded model, not a random one: a random model's answers hardly depend on its prompt.
    """
    run = tmp_path_factory.mktemp("run") / "run"
    train(
        build_config(
            {
                "task": "arith",
                "steps": 1,
                "batch_size": 2,
                "group_size": 2,
                "max_tokens": 4,
                "eval_num_problems": 2,
                "lr": 1e-9,
                "system_prompt": "Count the apples twice.",
                "output": str(run),
            },
            task_defaults=registry.recommended_settings,
        )
    )
    return run


def _eval(tmp_path, name, *args):
    out = tmp_path / name
    result = CliRunner().invoke(
        app, ["eval", *args, "--split", "validation", "--n", "6", "--max-tokens", "12", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    return json.loads((out / "report.json").read_text()), [r["model"]["completions"] for r in rows]


def test_eval_of_a_run_uses_the_prompt_it_trained_with(run_with_a_prompt, tmp_path):
    report, of_run = _eval(tmp_path, "run", "--model", str(run_with_a_prompt))
    assert report["system_prompt"] == "Count the apples twice."
    _, base_with_it = _eval(
        tmp_path, "typed", "--model", "embedded", "--system-prompt", "Count the apples twice."
    )
    _, base_default = _eval(tmp_path, "default", "--model", "embedded")
    assert of_run == base_with_it  # the prompt reached the model (lr 1e-9 left the adapters at ~0)
    assert of_run != base_default  # ... and it matters: another prompt, other completions
    report, overridden = _eval(tmp_path, "override", "--model", str(run_with_a_prompt), "--system-prompt", "")
    assert report["system_prompt"] == "" and overridden != of_run


def test_compare_evaluates_the_base_under_the_runs_prompt(run_with_a_prompt, tmp_path):
    out = tmp_path / "compare"
    result = CliRunner().invoke(
        app,
        [
            "compare",
            "--trained",
            str(run_with_a_prompt),
            "--split",
            "validation",
            "--n",
            "6",
            "--max-tokens",
            "12",
            "--output",
            str(out),
            "--no-plot",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "report.json").read_text())["system_prompt"] == "Count the apples twice."
    base = [json.loads(line)["base"]["completions"] for line in (out / "rows.jsonl").read_text().splitlines()]
    _, base_with_it = _eval(
        tmp_path, "typed", "--model", "embedded", "--system-prompt", "Count the apples twice."
    )
    assert base == base_with_it


def test_eval_and_compare_take_every_prompt_option_of_train():
    from mlx_grpo import cli

    prompt_options = {"system_prompt", "task", "data", "reward_file", "reward", "max_tokens"}
    for command in (cli.eval_command, cli.compare_command):
        assert prompt_options <= set(cli.inspect.signature(command).parameters)
