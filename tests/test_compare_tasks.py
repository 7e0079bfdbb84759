"""`eval` and `compare` on each kind of task (gsm8k, multi-turn web, ocaml, a training config's task),
the settings line they print, and user errors as one line with exit code 2."""

import json

import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import _all_or_typed, app
from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.run.task_setup import load_task

from compare_setup import task_and_settings


def test_eval_command_and_gsm8k(tiny_model_path, tmp_path):
    from test_gsm8k import GSM8K_DATA

    if not (GSM8K_DATA / "test.jsonl").is_file():
        pytest.skip("shared GSM8K data not found")
    out = tmp_path / "eval"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(tiny_model_path),
            "--task",
            "gsm8k",
            "--data",
            str(GSM8K_DATA),
            "--n",
            "5",
            "--max-tokens",
            "4",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["task"] == "gsm8k" and report["n"] == 5 and "paired" not in report
    model = report["models"]["model"]
    assert set(model["reward_parts"]) == {"correctness_reward", "format_reward"}
    assert model["truncated_frac"] == 1.0 and model["mean_length"] == 4.0  # a random model never stops


def test_user_errors_are_one_line_and_exit_2(tiny_model_path, tmp_path):
    runner = CliRunner()
    run_without_weights = tmp_path / "run"
    run_without_weights.mkdir()
    (run_without_weights / "config.yaml").write_text("task: arith\n")
    for args, fragment in [
        (["compare", "--trained", str(tmp_path / "missing")], "not found"),
        (["compare", "--trained", str(run_without_weights)], "no saved weights"),
        (["compare", "--trained", str(tiny_model_path)], "--base"),
        (
            ["compare", "--trained", str(tiny_model_path), "--base", str(tiny_model_path), "--split", "dev"],
            "--split",
        ),
        (
            ["compare", "--trained", str(tiny_model_path), "--base", str(tiny_model_path), "--samples", "0"],
            "--samples",
        ),
        (
            ["compare", "--trained", str(tiny_model_path), "--base", str(tiny_model_path), "--task", "nope"],
            "unknown task",
        ),
        (["eval", "--model", str(tiny_model_path), "--adapter", str(tmp_path / "missing")], "could not load"),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert fragment in result.output, (args, result.output)
        assert "Traceback" not in result.output


def test_multi_turn_task_is_played_through_its_environment(tiny_model_path):
    """The web task: episodes, not completions; scored by the environment."""
    from mlx_grpo.tasks.registry import BUILTIN_TASKS

    if "web" not in BUILTIN_TASKS:
        pytest.skip("the web task is not registered")
    task, settings = task_and_settings(str(tiny_model_path), n=1, max_tokens=4, task="web")
    assert task.make_env is not None
    settings.max_turns = 2
    spec = cmp.ModelSpec(str(tiny_model_path))
    report = cmp.compare(spec, spec, task, settings, n=1)
    base = report.results[0]
    assert base.answers[0].finish_reason in ("done", "max_turns", "max_tokens")
    assert 1 <= base.answers[0].length <= 2 * 4  # two turns of at most 4 tokens
    assert set(base.parts) and report.data["difference"] == 0.0


def test_ocaml_answers_are_graded_by_the_tasks_rewards(tiny_model_path):
    """compare's scoring of the OCaml task: a reference solution passes, prose does not."""
    import shutil as sh

    from mlx_grpo.tasks.registry import BUILTIN_TASKS

    if "ocaml" not in BUILTIN_TASKS or sh.which("ocaml") is None:
        pytest.skip("the OCaml task or toolchain is not available")
    from rewards.ocaml import problems

    task, _ = task_and_settings(str(tiny_model_path), n=2, task="ocaml")
    rows = cmp.select_rows(task, "test", 2)
    solutions = {p["id"]: p["solution"] for p in problems("test")}
    right = cmp.Answer(f"```ocaml\n{solutions[rows[0]['id']]}```", [], 40, "stop", False)
    wrong = cmp.Answer("I do not know OCaml.", [], 6, "stop", False)
    totals, parts, accuracy, errors, _ = cmp.score(task, rows, [right, wrong], 1)
    assert list(accuracy) == [1.0, 0.0] and not errors
    assert totals[0] > totals[1] and parts["ocaml_compiles"] == [1.0, 0.0]


def test_the_settings_line_shows_a_system_prompt_with_brackets_as_written(tiny_model_path):
    """A system prompt's "[n]" or "search[query]" is text, not rich markup (it vanished from the line)."""
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(tiny_model_path),
            "--n",
            "2",
            "--max-tokens",
            "4",
            "--system-prompt",
            "Reply with search[query] or [n].",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Reply with search[query] or [n]." in " ".join(result.output.split())


def test_a_training_config_file_gives_eval_its_task_and_episode_settings(tmp_path):
    """eval/compare --config FILE: the file's task and sampling keys, as a run folder's; typed flags win."""
    config_file = tmp_path / "multihop.yaml"
    config_file.write_text(
        "model: smollm2-135m\ntask: multihop\nmultihop_hops: [2]\nmax_tokens: 64\nmax_turns: 4\n"
        "max_episode_tokens: 512\ntool_style: llama3\nlr: 0.5\n"
    )
    config = cmp.task_config(None, "other-model", {"task": None, "max_tokens": 32}, config_file)
    assert (config.task, config.task_options.multihop_hops, config.max_turns, config.max_episode_tokens) == (
        "multihop",
        [2],
        4,
        512,
    )
    assert config.tool_style == "llama3" and config.sampling.max_tokens == 32  # the typed flag over the file
    assert config.model == "other-model" and config.lr != 0.5  # training settings are not read
    other_task = cmp.task_config(None, None, {"task": "arith"}, config_file)
    assert (
        other_task.task == "arith"
        and other_task.task_options.multihop_hops == []
        and other_task.tool_style is None
    )
    run = tmp_path / "run"  # a run's call style is part of its task
    run.mkdir()
    (run / "config.yaml").write_text("task: multihop\ntool_style: llama3\n")
    assert cmp.task_config(run, None, {}).tool_style == "llama3"
    with pytest.raises(cmp.CompareError, match="config file not found"):
        cmp.task_config(None, None, {}, tmp_path / "missing.yaml")
    result = CliRunner().invoke(
        app, ["eval", "--model", "embedded", "--config", str(tmp_path / "missing.yaml")]
    )
    assert result.exit_code == 2 and "config file not found" in result.output


def test_web_kinds_flag_scores_other_kinds_than_the_run_trained_on(tmp_path):
    """--web-kinds over a run's own web_kinds: "all" gives every kind, a list those kinds, a typo one line."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("task: web\nweb_kinds: [fact/1, shop/1]\neval_num_problems: 24\n")

    def kinds(typed):
        config = cmp.task_config(run, None, {"web_kinds": _all_or_typed(typed)})
        return sorted({row["kind"] for row in load_task(config).test_rows})

    assert kinds(None) == ["fact/1", "shop/1"]
    assert len(kinds("all")) == 12 and "account/3" in kinds("ALL")
    assert kinds("travel/2,account/3") == ["account/3", "travel/2"]
    result = CliRunner().invoke(
        app, ["eval", "--model", "embedded", "--task", "web", "--web-kinds", "fact/9"]
    )
    assert result.exit_code == 2 and "fact/9" in result.output
