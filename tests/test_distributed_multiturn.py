"""Data-parallel multi-turn runs: a step gives the same episodes on any number of processes, since an
episode's draws are keyed by its place in the step, not in a rank's share."""

import json
import os
import shutil
import subprocess
import sys

import mlx.core as mx
import pytest

from mlx_grpo.config import build_config
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run import distributed as dist
from mlx_grpo.run.step_rollouts import _sample_and_score, merge_rollouts
from mlx_grpo.run.trainer import train
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import recommended_settings

WEB = {
    "task": "web",
    "steps": 1,
    "batch_size": 4,
    "group_size": 2,
    "max_tokens": 6,
    "max_turns": 2,
    "max_episode_tokens": 600,
    "eval_num_problems": 2,
    "web_kinds": ["fact/1"],
    "system_prompt": "",
    "micro_batch_size": 4,
    "lr": 1e-3,
    "warmup_steps": 0,
    "seed": 3,
    "curriculum": "none",
}


def test_shares_of_a_step_play_the_episodes_of_the_whole(tiny_model_path):
    config = build_config({**WEB, "model": str(tiny_model_path)}, task_defaults=recommended_settings)
    task = load_task(config)
    model, tokenizer = load_policy(str(tiny_model_path))
    rows = task.train_rows[:5]
    whole = _sample_and_score(model, tokenizer, task, rows, config, 11, 0)
    shares = [
        _sample_and_score(model, tokenizer, task, rows[s.start : s.stop], config, 11, s.start)
        for s in (dist.shard(5, 0, 2), dist.shard(5, 1, 2))
    ]
    merged = merge_rollouts(shares, config.group_size)
    assert [ep.tokens for ep in merged[0]] == [ep.tokens for ep in whole[0]]
    assert [ep.turns for ep in merged[0]] == [ep.turns for ep in whole[0]]
    assert merged[1].total.tolist() == whole[1].total.tolist()
    assert len({tuple(ep.tokens) for ep in whole[0]}) > 1  # the episodes differ from one another


@pytest.mark.skipif(
    shutil.which("mlx.launch") is None
    or shutil.which("mlx-grpo") is None
    or not mx.distributed.is_available(),
    reason="needs mlx.launch, the mlx-grpo script and mx.distributed (ring backend)",
)
def test_two_ring_ranks_play_the_episodes_of_one_process(tmp_path, tiny_model_path):
    settings = {**WEB, "model": str(tiny_model_path)}
    flags = [
        part
        for k, v in settings.items()
        for part in (f"--{k.replace('_', '-')}", ",".join(v) if isinstance(v, list) else str(v))
    ]
    port = 20000 + (os.getpid() + 7) % 20000
    two = subprocess.run(
        [
            "mlx.launch",
            "--backend",
            "ring",
            "-n",
            "2",
            "-p",
            str(port),
            "--env",
            "MLX_GRPO_OPENBLAS=0",
            "--python",
            sys.executable,
            shutil.which("mlx-grpo"),
            "train",
            *flags,
            "--output",
            str(tmp_path / "two"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0 and (tmp_path / "two" / "summary.json").is_file(), two.stdout + two.stderr
    one = train(
        build_config({**settings, "output": str(tmp_path / "one")}, task_defaults=recommended_settings)
    )

    def episodes(folder):
        return [json.loads(line) for line in (folder / "completions.jsonl").read_text().splitlines()]

    ones, twos = episodes(one.run_dir), episodes(tmp_path / "two")
    assert len(ones) == 8 and [e["completion"] for e in twos] == [e["completion"] for e in ones]
    assert [e["reward"] for e in twos] == [e["reward"] for e in ones]
