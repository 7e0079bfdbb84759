"""`eval` and `compare` score the task as `train` uses it: the same screened rows, the same reward time
limit (run/setup.py's guard_task), and one meaning of accuracy, the share of answers that are right."""

import json
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import build_config
from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.setup import setup
from mlx_grpo.sampling.heldout import evaluate_accuracy
from mlx_grpo.run.task_setup import load_task


def _data_folder(tmp_path, test_lines, split="test"):
    """train.jsonl of 20 "say i" rows, and the given lines (written as they are) as the split's file."""
    folder = tmp_path / "data"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(20))
    )
    (folder / f"{split}.jsonl").write_text("".join(line + "\n" for line in test_lines))
    return folder


def _row(i):
    return json.dumps({"prompt": f"say {i}", "answer": str(i)})


HANGS = """import threading

def stuck(prompts, completions, **kw):
    if any(p.endswith(WHICH) for p in prompts):
        threading.Event().wait()  # never returns
    return [1.0 for _ in completions]
"""


def _eval_in_a_process(tiny_model_path, tmp_path, which: str, name: str):
    """`mlx-grpo eval` in its own process (a call left hanging cannot hold up the tests), with the
    reward's time limit set only in a --config file: (exit code, output, seconds, report or None)."""
    rewards = tmp_path / f"{name}.py"
    rewards.write_text(HANGS.replace("WHICH", repr(which)))
    config = tmp_path / f"{name}.yaml"
    config.write_text("reward_timeout: 2\n")
    out = tmp_path / f"{name}-report"
    args = [
        sys.executable,
        "-m",
        "mlx_grpo",
        "eval",
        "--model",
        str(tiny_model_path),
        "--task",
        "custom",
        "--data",
        str(_data_folder(tmp_path / name, [_row(i) for i in range(4)])),
        "--reward-file",
        str(rewards),
        "--reward",
        "stuck",
        "--config",
        str(config),
        "--max-tokens",
        "4",
        "--output",
        str(out),
    ]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    return done.returncode, done.stdout + done.stderr, seconds, report


def test_eval_bounds_a_hanging_reward_by_the_config_files_reward_timeout(tiny_model_path, tmp_path):
    # One example hangs: the batch call (2 s) and that example alone (2 s) time out; it alone is failed.
    code, output, seconds, report = _eval_in_a_process(tiny_model_path, tmp_path, " 1", "one")
    assert code == 0, output
    assert seconds < 120
    model = report["models"]["model"]
    assert model["reward_errors"] == {"stuck": 1}
    assert model["accuracy"] == pytest.approx(3 / 4)  # the failed example counts as wrong
    # Every example hangs: one line that says so, not a traceback, and no endless wait.
    code, output, seconds, report = _eval_in_a_process(tiny_model_path, tmp_path, "", "all")
    assert code == 2 and seconds < 120, output
    assert "reward 'stuck' failed on all 4 completions" in output and "timed out after 2s" in output
    assert "Traceback" not in output and report is None


def test_eval_scores_exactly_the_rows_of_trains_held_out_check(tiny_model_path, tmp_path):
    """A malformed line, a row without the column the reward needs and a prompt over max_prompt_tokens in the
    validation split: train leaves all three out of its held-out check, and so does eval of that split."""
    data = _data_folder(
        tmp_path,
        [
            _row(0),
            "{not json",
            json.dumps({"prompt": "say 2"}),
            _row(3),
            json.dumps({"prompt": "say " + "9" * 200, "answer": "9"}),
            _row(5),
        ],
        split="valid",
    )
    rewards = tmp_path / "rewards.py"
    rewards.write_text(
        "def exact(prompts, completions, answer):\n"
        "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n"
    )
    config_file = tmp_path / "run.yaml"
    config_file.write_text(
        f"model: {tiny_model_path}\ntask: custom\ndata: {data}\nreward_file: {rewards}\n"
        "reward: [exact]\nmax_tokens: 4\nmax_prompt_tokens: 64\n"
    )
    held_out = [r["prompt"] for r in setup(build_config(config_file=str(config_file))).task.eval_rows]
    assert held_out == ["say 0", "say 3", "say 5"]

    out = tmp_path / "eval"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(tiny_model_path),
            "--config",
            str(config_file),
            "--split",
            "validation",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["n"] == 3 and not report["models"]["model"]["reward_errors"]
    assert [json.loads(line)["prompt"] for line in (out / "rows.jsonl").read_text().splitlines()] == held_out

    # compare screens with each model it scores: both answer the very same rows.
    result = CliRunner().invoke(
        app,
        [
            "compare",
            "--trained",
            str(tiny_model_path),
            "--base",
            "embedded",
            "--config",
            str(config_file),
            "--split",
            "validation",
            "--no-plot",
            "--output",
            str(tmp_path / "c"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "c" / "report.json").read_text())["n"] == 3


PARTIAL = """def partial(prompts, completions, **kw):
    # partial credit by prompt: even numbers 0.8 (right), odd ones 0.3 (wrong)
    return [0.8 if int(p.split()[-1]) % 2 == 0 else 0.3 for p in prompts]
"""


def test_accuracy_is_the_share_of_right_answers_with_a_partial_credit_reward(tiny_model_path, tmp_path):
    """Rewards 0.8, 0.3, 0.8, 0.3: two of four answers are right (0.5 and above), so accuracy is 0.5,
    in train's before/after check, eval and compare alike; the mean reward 0.55 is a reward, not accuracy."""
    data = _data_folder(tmp_path, [_row(i) for i in range(4)])
    (data / "train.jsonl").write_text(
        "".join(_row(i) + "\n" for i in range(100, 120))
    )  # apart from both below
    (data / "valid.jsonl").write_text(
        "".join(_row(i) + "\n" for i in range(4, 8))
    )  # the run's check: 2 even, 2 odd
    rewards = tmp_path / "partial.py"
    rewards.write_text(PARTIAL)
    flags = {
        "task": "custom",
        "data": str(data),
        "reward_file": str(rewards),
        "reward": ["partial"],
        "max_tokens": 4,
    }
    task = load_task(cmp.task_config(None, str(tiny_model_path), flags))
    model, tokenizer = load_policy(str(tiny_model_path))
    assert evaluate_accuracy(model, tokenizer, task, 4)["accuracy"] == pytest.approx(0.5)

    out = tmp_path / "eval"
    args = [
        "--task",
        "custom",
        "--data",
        str(data),
        "--reward-file",
        str(rewards),
        "--reward",
        "partial",
        "--max-tokens",
        "4",
    ]
    result = CliRunner().invoke(app, ["eval", "--model", str(tiny_model_path), "--output", str(out), *args])
    assert result.exit_code == 0, result.output
    model_report = json.loads((out / "report.json").read_text())["models"]["model"]
    assert model_report["accuracy"] == pytest.approx(0.5)
    assert model_report["reward_parts"]["partial"] == pytest.approx(0.55)

    result = CliRunner().invoke(
        app,
        [
            "compare",
            "--trained",
            str(tiny_model_path),
            "--base",
            str(tiny_model_path),
            "--no-plot",
            "--output",
            str(tmp_path / "c"),
            *args,
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "c" / "report.json").read_text())
    assert [report["models"][m]["accuracy"] for m in ("base", "trained")] == pytest.approx([0.5, 0.5])
