"""Each command reads only its own settings (setting_groups.COMMAND_READS): a flag it does not read is
refused in one line naming the commands that read it; a YAML recipe's settings it does not read are left
out of its config. And each setting's help text is its field's metadata."""

import ast
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlx_grpo import api
from mlx_grpo.cli import app
from mlx_grpo.config import (
    FIELDS,
    JUDGE_KEYS,
    READS,
    ConfigError,
    TrainConfig,
    build_config,
    file_settings_not_read,
    not_read,
)
from mlx_grpo.evaluation.compare import CompareError, task_config
from mlx_grpo.setting_groups import GROUPS
from mlx_grpo.tasks.registry import recommended_settings

ROOT = Path(__file__).resolve().parents[1]


def _command(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLX_GRPO_OPENBLAS": "0"}
    return subprocess.run(
        [sys.executable, "-m", "mlx_grpo.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (["sft", "--group-size", "4"], "error: sft does not read group_size (train reads it)"),
        (["sft", "--no-guide"], "error: sft does not read guide (train reads it)"),
        (
            ["sft", "--judge", "smollm2-135m"],
            "error: sft does not read judge (train, eval and compare read it)",
        ),
        (
            ["eval", "--model", "embedded", "--lr", "0.1"],
            "error: eval does not read lr (train and sft read it)",
        ),
        (
            ["eval", "--model", "embedded", "--max-turns", "3"],
            "error: eval takes max_turns from --config FILE or a run's config.yaml, not as a flag",
        ),
    ],
)
def test_a_flag_the_command_does_not_read_is_one_line(args, line):
    done = _command(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_each_command_s_flags_are_the_settings_it_reads():
    import typer

    commands = typer.main.get_command(app).commands
    flags = {name: {p.name for p in commands[name].params} - {"config"} for name in ("train", "sft")}
    assert flags["train"] == set(FIELDS) and flags["sft"] == READS["sft"]
    assert "--group-size" not in CliRunner().invoke(app, ["sft", "--help"], env={"COLUMNS": "250"}).output
    assert READS["train"] == set(FIELDS)
    assert {
        "group_size",
        "loss",
        "beta",
        "judge",
        "guide",
        "prefilter",
        "keep_best",
        "warm_start_steps",
        "curriculum",
        "reward",
    }.isdisjoint(READS["sft"])
    assert {"time_limit_minutes", "report_to", "lr", "steps", "health_window", "web_kinds"} <= READS["sft"]


def test_the_table_names_settings_and_groups_only():
    from mlx_grpo.evaluation import model_names

    # what evaluation/model_names.py treats as the task's and its guards' settings, eval reads
    assert (
        {*model_names._TASK_KEYS, *model_names._GUARD_KEYS, *JUDGE_KEYS} <= READS["eval"] == READS["compare"]
    )
    assert not_read("sft", "beta") == "sft does not read beta (train reads it)"
    assert not_read("sft", "reward_file") == "sft does not read reward_file (train, eval and compare read it)"


def test_build_config_refuses_a_typed_setting_the_command_does_not_read():
    with pytest.raises(ConfigError, match=r"^sft does not read group_size \(train reads it\)$"):
        build_config({"group_size": 4}, command="sft")
    assert build_config({"group_size": 4}).group_size == 4  # train's


def test_a_recipe_s_settings_sft_does_not_read_are_left_out(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "task: arith\nlr: 0.002\ngroup_size: 4\nloss: cispo\njudge: smollm2-135m\nseed: 3\n"
        "num_iterations: 1\nwarm_start:\n  steps: 5\n"
    )
    config = build_config({}, str(recipe), task_defaults=recommended_settings, command="sft")
    assert (config.lr, config.seed) == (0.002, 3)  # read
    assert config.group_size == 8 and config.objective.loss == "grpo" and config.judge is None
    assert config.warm_start.steps == 0  # left out: sft_setup would refuse a warm start
    # the task's recommendations are left out too where sft does not read them: web's curriculum is GRPO's
    assert build_config({"task": "web"}, task_defaults=recommended_settings).curriculum == "ued"
    assert (
        build_config({"task": "web"}, task_defaults=recommended_settings, command="sft").curriculum == "none"
    )
    # only what differs from the default is named (num_iterations: 1 is the default)
    assert file_settings_not_read(str(recipe), "sft") == ["group_size", "loss", "judge", "warm_start_steps"]
    assert file_settings_not_read(str(recipe), "train") == []
    full = build_config({}, str(recipe), task_defaults=recommended_settings)
    assert full.group_size == 4 and full.objective.loss == "cispo" and full.warm_start.steps == 5


def test_sft_with_a_train_recipe_runs_with_what_it_reads(tmp_path, monkeypatch):
    """The accepted path: `sft --config RECIPE` with train-only keys and sft's own flags reaches the run,
    with a line naming what it leaves out."""
    seen = {}

    def fake_sft(config, on_event=None):
        seen["config"] = config
        return None

    monkeypatch.setattr(api, "sft", fake_sft)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("task: arith\ngroup_size: 4\nbeta: 0.1\nsteps: 7\n")
    out = CliRunner().invoke(
        app,
        [
            "sft",
            "--config",
            str(recipe),
            "--lr",
            "0.003",
            "--time-limit-minutes",
            "5",
            "--output",
            str(tmp_path / "run"),
        ],
    )
    assert out.exit_code == 0, out.output
    config = seen["config"]
    assert (config.steps, config.lr, config.time_limit_minutes) == (7, 0.003, 5.0)
    assert config.group_size == 8 and config.objective.beta == 0.0
    assert f"sft does not read group_size, beta (set in {recipe}): left out" in out.output.replace("\n", "")


def test_eval_takes_from_a_train_recipe_what_it_reads(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "task: arith\nmax_tokens: 33\ngroup_size: 4\nloss: cispo\nlr: 0.5\nkeep_quantized: true\n"
    )
    config = task_config(None, None, {}, recipe)
    assert config.sampling.max_tokens == 33 and config.keep_quantized  # read
    assert config.group_size == 8 and config.objective.loss == "grpo" and config.lr == 1e-4  # left out
    recipe.write_text("task: arith\ngrup_size: 4\n")  # no command reads it: refused, with a did-you-mean
    with pytest.raises(CompareError, match="unknown setting 'grup_size' \\(did you mean 'group_size'\\?\\)"):
        task_config(None, None, {}, recipe)


def test_every_setting_s_help_is_its_field_s_metadata():
    for name, f in FIELDS.items():
        assert isinstance(f.metadata.get("help"), str) and f.metadata["help"].strip(), name
    # a group field of TrainConfig is no setting and has no help of its own
    assert all(not f.metadata for f in dataclasses.fields(TrainConfig) if f.name in GROUPS)


def test_settings_lines_stay_within_110_characters():
    """A long help text spans several source lines (implicit concatenation) rather than one long comment."""
    for path in (ROOT / "mlx_grpo" / "config.py", ROOT / "mlx_grpo" / "setting_groups.py"):
        tree = ast.parse(path.read_text())
        lines = path.read_text().splitlines()
        for cls in tree.body:
            if isinstance(cls, ast.ClassDef):
                for node in cls.body:
                    if isinstance(node, ast.AnnAssign):
                        long = [n for n in range(node.lineno, node.end_lineno + 1) if len(lines[n - 1]) > 110]
                        assert not long, f"{path.name}:{long[0]}: over 110 characters"
