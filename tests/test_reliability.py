"""Real `mlx-grpo train` processes, killed (SIGKILL, at seeded random moments and
inside a checkpoint write) or interrupted (Ctrl-C), then resumed: the run ends
with bitwise the weights of a run that was never interrupted. A full disk
during a checkpoint, an unwritable output folder and a reward that always fails
end in one clear line."""

import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import build_config
from mlx_grpo.run import checkpoint as ckpt
from mlx_grpo.files import training_rows
from mlx_grpo.run.trainer import train

MLX_GRPO = [str(Path(sys.executable).parent / "mlx-grpo"), "train"]
# The embedded model on the arith task, small enough for a second a step on 2 cores.
RUN = [
    "--steps",
    "8",
    "--batch-size",
    "2",
    "--group-size",
    "2",
    "--max-tokens",
    "16",
    "--save-every",
    "4",
    "--eval-num-problems",
    "2",
    "--seed",
    "3",
    "--lr",
    "1e-3",
    "--keep-checkpoints",
    "2",
]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
# For runs whose weights are not compared: skip the CLI's re-execution with OpenBLAS (blas.py), a second
# start-up.
QUICK_ENV = {**ENV, "MLX_GRPO_OPENBLAS": "0"}

# Runs the CLI in a process that SIGKILLs itself inside its first checkpoint write:
# every data file of the checkpoint is written, its manifest is not.
KILL_IN_CHECKPOINT = """
import os, signal
from mlx_grpo.run import checkpoint
fsync = checkpoint.fsync_file
def fsync_then_die(path):
    fsync(path)
    if path.name == "optimizer.safetensors" and ".tmp-" in path.parent.name:
        os.kill(os.getpid(), signal.SIGKILL)
checkpoint.fsync_file = fsync_then_die
from mlx_grpo.cli import main
main()
"""


def launch(args, command=MLX_GRPO, env=ENV, **kw):
    return subprocess.Popen(
        command + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw
    )


def wait_for_a_step(proc) -> bool:
    """Read the plain progress lines until the first finished step (False: it ended first)."""
    for line in proc.stdout:
        if line.startswith("step "):
            return True
    return False


def adapters(run_dir):
    return {k: np.array(v) for k, v in mx.load(str(Path(run_dir) / "adapters.safetensors")).items()}


def assert_same_weights(a_dir, b_dir):
    a, b = adapters(a_dir), adapters(b_dir)
    assert a.keys() == b.keys() and a
    for name in a:
        assert np.array_equal(a[name], b[name]), name  # bitwise (MLX CPU backend)


def step_losses(run_dir):
    lines = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [(m["step"], m["loss"]) for m in training_rows(lines)]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run, started in the background: the tests that need it wait for it."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    proc = launch(RUN + ["--output", str(run_dir)])

    def finished():
        out, errors = proc.communicate(timeout=300)
        assert proc.returncode == 0, errors
        return run_dir

    return finished


def test_kill_9_and_ctrl_c_anywhere_then_resume_gives_the_same_weights(straight, tmp_path):
    run_dir = tmp_path / "run"
    rng = random.Random(9)
    resume = RUN + ["--resume", str(run_dir)]
    seen = []

    # 1. Ctrl-C after a step: the step is finished, a checkpoint written, exit code 130.
    proc = launch(RUN + ["--output", str(run_dir)])
    assert wait_for_a_step(proc)
    proc.send_signal(signal.SIGINT)
    out, errors = proc.communicate(timeout=120)
    assert proc.returncode == 130, errors
    assert "Ctrl-C: stopping after this step" in errors
    stopped = int(errors.split("interrupted after step ")[1].split(",")[0])
    assert f"checkpoint saved; continue with: mlx-grpo train --resume {run_dir}" in errors
    assert "Traceback" not in errors
    assert ckpt.latest_checkpoint(run_dir).name == ckpt.checkpoint_name(
        stopped
    )  # save_every 4: Ctrl-C saved it
    seen.append(("ctrl-c", stopped))

    # 2. SIGKILL in the middle of writing a checkpoint: data files written, manifest not.
    proc = launch(resume, command=[sys.executable, "-c", KILL_IN_CHECKPOINT, "train"])
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert list((run_dir / "checkpoints").glob(".step_*.tmp-*"))  # the unfinished folder is there ...
    assert ckpt.latest_checkpoint(run_dir).name == ckpt.checkpoint_name(stopped)  # ... and never used
    seen.append(("kill in checkpoint", stopped))

    # 3. SIGKILL at seeded random moments after training got going (rollout, update, write, ...).
    for _ in range(2):
        proc = launch(resume)
        started = wait_for_a_step(proc)
        delay = rng.uniform(0.0, 1.5)
        time.sleep(delay)
        proc.kill()
        proc.communicate(timeout=60)
        newest = ckpt.latest_checkpoint(run_dir)
        seen.append(("kill", started, round(delay, 2), newest.name if newest else None))

    # 4. Resume to the end.
    proc = launch(resume)
    out, errors = proc.communicate(timeout=120)
    assert proc.returncode == 0, errors
    print("interruptions:", seen)

    straight_dir = straight()
    assert_same_weights(straight_dir, run_dir)
    assert step_losses(run_dir) == step_losses(straight_dir)  # each step once, same numbers
    assert not list((run_dir / "checkpoints").glob(".step_*"))  # leftovers of killed writers are cleaned up


def test_resume_passes_over_a_damaged_checkpoint(tmp_path, tiny_model_path):
    """The newest checkpoint damaged on disk: resume warns, goes back to the previous one,
    redoes the steps after it and ends with the same weights (in-process, same BLAS both times)."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(20)))
    rewards = tmp_path / "r.py"
    rewards.write_text(
        "def variety(prompts, completions, **kw):\n    return [len(set(c)) / 10 for c in completions]\n"
    )
    run_dir = tmp_path / "run"
    config = build_config(
        dict(
            model=str(tiny_model_path),
            data=str(data),
            reward_file=str(rewards),
            reward=["variety"],
            steps=4,
            batch_size=2,
            group_size=4,
            max_tokens=8,
            lr=1e-2,
            save_every=1,
            seed=5,
            output=str(run_dir),
            warmup_steps=1,
        )
    )
    train(config)
    expected = adapters(run_dir)
    newest = ckpt.latest_checkpoint(run_dir)
    assert newest.name == "step_000004"
    data = bytearray((newest / "adapters.safetensors").read_bytes())
    data[-1] ^= 0x01
    (newest / "adapters.safetensors").write_bytes(bytes(data))

    warnings = []
    train(
        build_config({"resume": str(run_dir), "output": str(run_dir)}, str(run_dir / "config.yaml")),
        on_event=lambda kind, d: warnings.extend(d["warnings"]) if kind == "start" else None,
    )
    assert warnings[-1] == (
        f"checkpoint {newest} is corrupt: adapters.safetensors does not match its sha256 "
        f"checksum; resuming from step_000003 instead (moved it to corrupt-step_000004)"
    )
    got = adapters(run_dir)
    assert all(np.array_equal(expected[k], got[k]) for k in expected)
    assert [s for s, _ in step_losses(run_dir)] == [1, 2, 3, 4]


def _limit_file_size():
    # A file may grow to 140 kB: the adapters (93 kB) fit, the optimizer state (186 kB) does not.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (140_000, 140_000))


def test_a_failed_checkpoint_write_is_one_clear_line_and_keeps_the_previous(straight, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(straight(), run_dir)
    before = {p.name: p.read_bytes() for p in (run_dir / "checkpoints" / "step_000008").iterdir()}
    proc = launch(
        RUN + ["--resume", str(run_dir), "--steps", "10", "--save-every", "1"],
        preexec_fn=_limit_file_size,
        env=QUICK_ENV,
    )
    out, errors = proc.communicate(timeout=120)
    assert proc.returncode == 2, errors
    lines = [x for x in errors.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in errors
    assert lines[0].startswith("error: could not write checkpoint step_000009")
    assert lines[0].endswith("the previous checkpoint step_000008 is intact")
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000004", "step_000008"]
    assert {p.name: p.read_bytes() for p in (root / "step_000008").iterdir()} == before
    assert ckpt.verify_checkpoint(root / "step_000008") is None


def test_second_ctrl_c_exits_at_once(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(5)))
    rewards = tmp_path / "slow.py"
    rewards.write_text(
        "import time\n\ndef slow(prompts, completions, **kw):\n"
        "    time.sleep(3)\n    return [len(c) % 3 for c in completions]\n"
    )
    proc = launch(
        [
            "--data",
            str(data),
            "--reward-file",
            str(rewards),
            "--reward",
            "slow",
            "--steps",
            "5",
            "--batch-size",
            "1",
            "--group-size",
            "2",
            "--max-tokens",
            "4",
            "--output",
            str(tmp_path / "run"),
        ],
        env=QUICK_ENV,
    )
    for line in proc.stdout:  # the run has started (no held-out rows: no evaluation before)
        if line.startswith("mlx-grpo task"):
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    for line in proc.stderr:  # the first Ctrl-C is acknowledged: the step is still in its 3 s reward
        if line.startswith("Ctrl-C: stopping after this step"):
            break
    proc.send_signal(signal.SIGINT)
    out, errors = proc.communicate(timeout=60)
    assert proc.returncode == 130, errors
    assert "interrupted at once; the newest complete checkpoint is intact" in errors
    assert "Traceback" not in errors
    assert ckpt.latest_checkpoint(tmp_path / "run") is None  # step 1 never finished: nothing saved


def test_unwritable_output_folder_is_reported_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = CliRunner().invoke(app, ["train", "--output", str(blocker / "run"), "--steps", "1"])
    assert result.exit_code == 2
    assert f"error: output folder {blocker / 'run'} is not writable" in result.output
    assert "Traceback" not in result.output


def test_a_reward_failing_on_every_example_stops_the_run(tmp_path, tiny_model_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(20)))
    rewards = tmp_path / "r.py"
    rewards.write_text(
        "def broken(prompts, completions, answer):\n    return [float(a) / 0 for a in answer]\n"
    )
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            str(tiny_model_path),
            "--data",
            str(data),
            "--reward-file",
            str(rewards),
            "--reward",
            "broken",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--max-tokens",
            "4",
            "--output",
            str(tmp_path / "run"),
            "--eval-num-problems",
            "1",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "error: reward 'broken' failed on all" in result.output
    assert "ZeroDivisionError: float division by zero (prompt 'say" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seed", "-1"], "seed must be in [0, 2**63), got -1"),
        (["--lr", "inf"], "lr must be a finite number, got inf"),
        (["--temperature", "nan"], "temperature must be a finite number, got nan"),
        (["--steps", "3000000000"], "steps is too large: 3000000000"),
        (["--on-bad-data", "drop"], "on_bad_data must be skip or error; got 'drop'"),
        (["--reward-timeout", "-1"], "reward_timeout must be >= 0 (0: no limit), got -1.0"),
        (["--max-prompt-tokens", "0"], "max_prompt_tokens must be >= 1"),
        (["--lora-layers", "0"], "lora_layers must be -1 (all) or at least 1, got 0"),
        (["--keep-best"], "keep_best needs 0 < eval_steps < steps"),
        (["--keep-best", "--eval-steps", "5", "--steps", "5"], "got eval_steps 5, steps 5"),
        (["--group-size", "1"], "group_size must be at least 2"),
        (["--epsilon-low", "1"], "epsilon_low must be in [0, 1)"),
    ],
)
def test_config_mistakes_are_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: {message}" or message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_keep_best_keeps_the_best_evaluated_checkpoint(tmp_path, tiny_model_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(30)))
    rewards = tmp_path / "r.py"
    rewards.write_text(
        "def variety(prompts, completions, **kw):\n    return [len(set(c)) / 10 for c in completions]\n"
    )
    run_dir = tmp_path / "run"
    train(
        build_config(
            dict(
                model=str(tiny_model_path),
                data=str(data),
                reward_file=str(rewards),
                reward=["variety"],
                steps=5,
                batch_size=2,
                group_size=2,
                max_tokens=6,
                lr=3e-2,
                save_every=100,
                seed=1,
                eval_steps=1,
                keep_best=True,
                keep_checkpoints=1,
                eval_num_problems=3,
                output=str(run_dir),
            )
        )
    )
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accuracy = {m["step"]: m["eval/accuracy"] for m in training_rows(lines) if "eval/accuracy" in m}
    assert sorted(accuracy) == [1, 2, 3, 4]  # evaluated during training (not at the last step)
    best = max(accuracy, key=lambda s: (accuracy[s], -s))  # the first to reach the best
    root = run_dir / "checkpoints"
    assert (root / "best").read_text().strip() == ckpt.checkpoint_name(best)
    assert sorted(p.name for p in root.glob("step_*")) == sorted({ckpt.checkpoint_name(best), "step_000005"})
    assert (
        json.loads((root / ckpt.checkpoint_name(best) / "state.json").read_text())["eval_metric"]
        == accuracy[best]
    )
