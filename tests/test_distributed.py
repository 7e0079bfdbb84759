"""Data-parallel training: per-completion seeding, sharding and merging, and a
2-process ring run (mlx.launch) that ends with the weights of a 1-process run."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_grpo.tasks.data import encode_prompt

from mlx_grpo.config import build_config
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run import distributed as dist
from mlx_grpo.run.step_rollouts import _sample_and_score, merge_rollouts
from mlx_grpo.run.trainer import train
from mlx_grpo.sampling.rollout import (
    KeyedSampler,
    SamplingConfig,
    completion_seeds,
    draw_tokens,
    sample_completions,
)
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import recommended_settings


def test_shard_is_contiguous_whole_and_uneven_first():
    assert [list(dist.shard(5, r, 2)) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert [list(dist.shard(7, r, 3)) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [list(dist.shard(1, r, 3)) for r in range(3)] == [[0], [], []]
    assert list(dist.shard(4)) == [0, 1, 2, 3]  # one process takes everything


def test_one_process_helpers_change_nothing():
    tree = {"a": [mx.array([1.0, 2.0])], "b": mx.array([[3]], dtype=mx.int32)}
    assert dist.all_sum_tree(tree) is tree
    assert dist.sum_across_ranks({"x": 1.5}) == {"x": 1.5}
    assert dist.all_gather_objects(("anything", 1)) == [("anything", 1)]
    assert dist.is_main() and dist.size() == 1


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    return load_policy(str(tiny_model_path))


def _groups(completions, g):
    return [[c.tokens for c in completions[i : i + g]] for i in range(0, len(completions), g)]


def test_a_prompts_group_depends_only_on_seed_and_its_id(policy):
    model, tokenizer = policy
    prompts = [encode_prompt(tokenizer, q) for q in ("what is 2+3?", "add 17 and 5", "hi", "count to 3")]
    sampling = SamplingConfig(temperature=1.0, max_tokens=12)
    whole = _groups(sample_completions(model, tokenizer, prompts, 3, sampling, seed=5), 3)
    # the last two prompts alone (as a second rank would sample them), and in narrow waves
    tail = _groups(
        sample_completions(model, tokenizer, prompts[2:], 3, sampling, seed=5, prompt_ids=[2, 3]), 3
    )
    narrow = _groups(sample_completions(model, tokenizer, prompts, 3, sampling, concurrency=4, seed=5), 3)
    assert tail == whole[2:]
    assert narrow == whole
    assert len({tuple(t) for t in whole[0]}) > 1  # members of a group still differ
    other = _groups(sample_completions(model, tokenizer, prompts, 3, sampling, seed=6), 3)
    assert other != whole


def _frequencies(sampling, logits, n=20000):
    sampler = KeyedSampler(sampling, completion_seeds(3, list(range(n)), 1))
    sampler.rows = list(range(n))
    logprobs = mx.broadcast_to(mx.array(logits) - mx.logsumexp(mx.array(logits)), (n, len(logits)))
    tokens = np.array(sampler(logprobs))
    return np.bincount(tokens, minlength=len(logits)) / n


def test_keyed_sampler_draws_from_the_tempered_softmax():
    logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0])
    got = _frequencies(SamplingConfig(temperature=0.7, max_tokens=4), logits)
    want = np.exp(logits / 0.7) / np.exp(logits / 0.7).sum()
    np.testing.assert_allclose(got, want, atol=0.015)  # ~4 standard errors at n = 20000
    top2 = _frequencies(SamplingConfig(temperature=1.0, top_k=2, max_tokens=4), logits)
    kept = np.exp(logits[:2]) / np.exp(logits[:2]).sum()
    np.testing.assert_allclose(top2, [*kept, 0, 0, 0], atol=0.015)


def test_sharded_rollouts_merge_into_the_one_process_result(tmp_path, policy, tiny_model_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(5)))
    rewards = tmp_path / "rewards.py"
    rewards.write_text(
        "def variety(prompts, completions, **kw):\n    return [len(set(c)) / 10 for c in completions]\n"
    )
    config = build_config(
        dict(
            model=str(tiny_model_path),
            data=str(data),
            reward_file=str(rewards),
            reward=["variety"],
            group_size=2,
            max_tokens=8,
        )
    )
    task = load_task(config)
    model, tokenizer = policy
    rows = task.train_rows[:5]
    whole = _sample_and_score(model, tokenizer, task, rows, config, 11, 0)
    shares = [
        _sample_and_score(model, tokenizer, task, rows[s.start : s.stop], config, 11, s.start)
        for s in (dist.shard(5, 0, 2), dist.shard(5, 1, 2))
    ]
    merged = merge_rollouts(shares + [None], config.group_size)  # None: a rank with no prompts
    assert [c.tokens for c in merged[0]] == [c.tokens for c in whole[0]]
    assert [c.prompt_index for c in merged[0]] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    np.testing.assert_array_equal(merged[1].total, whole[1].total)
    assert merged[1].parts == whole[1].parts


ARGS = [
    "--steps",
    "2",
    "--batch-size",
    "4",
    "--group-size",
    "2",
    "--micro-batch-size",
    "2",
    "--max-tokens",
    "12",
    "--eval-num-problems",
    "2",
    "--lr",
    "1e-3",
    "--warmup-steps",
    "0",
    "--kl-every",
    "1",
    "--seed",
    "3",
]


@pytest.mark.skipif(
    shutil.which("mlx.launch") is None
    or shutil.which("mlx-grpo") is None
    or not mx.distributed.is_available(),
    reason="needs mlx.launch, the mlx-grpo script and mx.distributed (ring backend)",
)
def test_two_ring_ranks_end_with_the_weights_of_one_process(tmp_path):
    # The launch the README gives: each rank runs the mlx-grpo script with the same flags.
    port = 20000 + os.getpid() % 20000
    # The ranks use the BLAS this process uses (the CLI would preload OpenBLAS on Linux: other rounding).
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
            *ARGS,
            "--output",
            str(tmp_path / "two"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    # mlx.launch may exit 0 when a rank failed: the finished run folder is the evidence
    assert two.returncode == 0 and (tmp_path / "two" / "summary.json").is_file(), two.stdout + two.stderr

    flags = {ARGS[i][2:].replace("-", "_"): ARGS[i + 1] for i in range(0, len(ARGS), 2)}
    one = train(build_config({**flags, "output": str(tmp_path / "one")}, task_defaults=recommended_settings))

    a = mx.load(str(one.run_dir / "adapters.safetensors"))
    b = mx.load(str(tmp_path / "two" / "adapters.safetensors"))
    assert a.keys() == b.keys()
    assert (
        max(float(mx.abs(a[k]).max()) for k in a if k.endswith("lora_b")) > 1e-3
    )  # training moved them from 0
    for k in a:
        np.testing.assert_allclose(np.array(b[k]), np.array(a[k]), atol=1e-4)

    def metrics(folder):
        return [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines()]

    for m1, m2 in zip(metrics(one.run_dir), metrics(tmp_path / "two"), strict=True):
        for key in ("reward/mean", "reward/std", "frac_zero_std", "completion/mean_length", "eval/accuracy"):
            assert m1.get(key) == m2.get(key), key
        for key in ("grad_norm", "loss", "kl"):
            if m1.get(key) is not None:
                assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-7), key
    # the same completions; rank 0 alone wrote them and alone printed the summary
    assert (one.run_dir / "completions.jsonl").read_text() == (
        tmp_path / "two" / "completions.jsonl"
    ).read_text()
    assert two.stdout.count("run folder:") == 1


def test_draws_survive_rounding_level_changes_in_the_logits():
    """Two batches sharing a prompt compute its logits with different roundings; the draws must not care.
    (Inverse-CDF sampling, tried for speed, moved ~3% of these draws.)"""
    rng = np.random.default_rng(0)
    rows, vocab = 256, 50000
    logits = rng.normal(size=(rows, vocab)).astype(np.float32) * 2  # flat, like an untrained model
    nudged = logits + rng.normal(size=logits.shape).astype(np.float32) * 1e-5
    keys = KeyedSampler(
        SamplingConfig(temperature=1.0, max_tokens=1), completion_seeds(0, list(range(rows)), 1)
    )
    at = keys.keys_at(list(range(rows)), [0] * rows)
    a, _ = draw_tokens(mx.array(logits), at, SamplingConfig(temperature=1.0))
    b, _ = draw_tokens(mx.array(nudged), at, SamplingConfig(temperature=1.0))
    assert (np.array(a) == np.array(b)).all()
