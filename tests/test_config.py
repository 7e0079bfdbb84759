"""Config layering (defaults < task < file < typed flags), validation, and the
CLI's one-line errors."""

import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import ConfigError, build_config
from mlx_grpo.setting_groups import ObjectiveSettings
from mlx_grpo.tasks.registry import recommended_settings


def write(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def test_precedence_defaults_task_file_flags(tmp_path):
    path = write(tmp_path, "lr: 0.5\ngroup_size: 3\ntemperature: 0.9\n")
    c = build_config({"group_size": 5, "beta": None}, path, task_defaults=recommended_settings)
    assert c.group_size == 5  # typed flag beats the file
    assert c.lr == 0.5  # file beats the task's recommendation
    assert c.sampling.temperature == 0.9  # file beats the default
    assert c.objective.beta == ObjectiveSettings.beta  # a flag that was not typed (None) overrides nothing
    assert c.sampling.max_tokens == recommended_settings("arith", None)["max_tokens"]  # task beats default
    assert c.objective.epsilon_low == ObjectiveSettings.epsilon_low  # nobody set it


def test_task_recommendations_depend_on_the_model():
    embedded, chat = (
        recommended_settings("arith", None),
        recommended_settings("arith", "Qwen/Qwen2.5-0.5B-Instruct"),
    )
    assert embedded["lr"] == 1e-4 and "system_prompt" not in embedded
    assert chat["lr"] == 3e-5 and chat["system_prompt"]  # the chat recipe (tests/test_chat_tasks.py)


def test_data_or_reward_file_without_task_means_custom(tmp_path):
    rewards = tmp_path / "r.py"
    rewards.write_text("def f(prompts, completions): return [0.0] * len(completions)\n")
    c = build_config({"data": "x.jsonl", "reward_file": str(rewards), "reward": ["f"]})
    assert c.task == "custom"
    assert build_config({}).task == "arith"


def test_dashed_keys_lists_and_numbers_from_yaml(tmp_path):
    path = write(tmp_path, "group-size: 4\nreward: [a, b]\nreward_weights: [1, 0.5]\nlr: 1e-5\n")
    c = build_config({}, path)
    assert c.group_size == 4 and c.reward == ["a", "b"] and c.reward_weights == [1.0, 0.5] and c.lr == 1e-5


@pytest.mark.parametrize(
    "text, message",
    [
        ("group_sise: 4\n", "did you mean 'group_size'"),
        ("group_size: 1\n", "group_size must be at least 2"),
        ("group_size: four\n", "group_size: expected an integer"),
        ("temperature: 0\n", "temperature must be > 0"),
        ("loss: ppo\n", "loss must be one of"),
        ("scale_rewards: std\n", "scale_rewards must be one of"),
        ("epsilon_low: 1.5\n", "epsilon_low must be in [0, 1)"),
        ("- just\n- a list\n", "expected a mapping"),
        ("lr: [1, 2\n", "not valid YAML"),
        ("reward: [a]\nreward_weights: [1, 2]\n", "reward_weights has 2 entries but 1 rewards"),
    ],
)
def test_bad_files_are_rejected_clearly(tmp_path, text, message):
    with pytest.raises(
        ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        build_config({}, write(tmp_path, text))


def test_cli_errors_are_one_line_and_exit_2(tmp_path):
    runner = CliRunner()
    for args, fragment in [
        (["train", "--group-size", "1"], "group_size must be at least 2"),
        (["train", "--config", str(tmp_path / "missing.yaml")], "config file not found"),
        (["train", "--loss", "nope"], "loss must be one of"),
        (["train", "--resume", str(tmp_path)], "not a run folder"),
        (
            ["train", "--data", str(tmp_path / "none.jsonl"), "--reward-file", __file__, "--reward", "f"],
            "data file not found",
        ),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert fragment in result.output
        assert "Traceback" not in result.output


def test_every_setting_has_a_flag_and_a_settings_entry():
    from pathlib import Path

    from mlx_grpo.config import FIELDS, field_help

    readme = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text()
    help_text = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "250"}).output
    helps = field_help()
    for name in FIELDS:
        assert f"`{name}`" in readme, f"docs/settings.md lacks the setting {name}"
        assert f"--{name.replace('_', '-')}" in help_text, f"no flag for {name}"
        assert helps.get(name), f"{name} has no help text in its field's metadata"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["train", "--steps", "many"], "Invalid value for '--steps'"),
        (["train", "--stepz", "3"], "No such option: --stepz"),
    ],
)
def test_flag_parse_errors_are_one_line_from_the_command(args, fragment):
    """Typer's own usage errors (wrong type, unknown flag) also end in one line and exit 2."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MLX_GRPO_OPENBLAS": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "mlx_grpo.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], done.stderr


def test_reward_weights_for_a_tasks_own_rewards(tmp_path):
    """--reward-weights without --reward weighs the task's own rewards (multihop: 1,0,0.2 turns on
    support)."""
    from mlx_grpo.run.task_setup import load_task

    settings = {"task": "multihop", "eval_num_problems": 2, "output": str(tmp_path / "run")}
    config = build_config({**settings, "reward_weights": "1,0,0.2"}, task_defaults=recommended_settings)
    assert load_task(config).reward_weights == [1.0, 0.0, 0.2]
    config = build_config({**settings, "reward_weights": [1, 0]}, task_defaults=recommended_settings)
    with pytest.raises(
        ConfigError, match=r"2 entries but task 'multihop' has 3 rewards \(exact_match_reward, "
    ):
        load_task(config)
