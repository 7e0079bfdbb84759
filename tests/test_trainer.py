"""Pieces of the training loop: batching, skipping silent groups, data order."""

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlx_grpo.config import build_config
from mlx_grpo.losses import BatchShape
from mlx_grpo.policy import load_policy, prepare_for_training
from mlx_grpo.rollout import Completion
from mlx_grpo.batch import batch_rows, build_batch, groups_with_signal, micro_batches
from mlx_grpo.trainer import make_optimizer, update


def _completions(rng, n_groups, g):
    out = []
    for i in range(n_groups):
        prompt = [int(t) for t in rng.integers(3, 250, 3 + i)]
        for _ in range(g):
            k = int(rng.integers(1, 6))
            out.append(Completion(i, prompt, [int(t) for t in rng.integers(3, 250, k)],
                                  list(rng.normal(-3, 0.5, k)), "length", ""))
    return out


def test_build_batch_layout():
    rng = np.random.default_rng(0)
    comps = _completions(rng, 2, 3)
    batch = build_batch(comps, np.arange(6.0), 3)
    assert batch.prompts == [comps[0].prompt_tokens, comps[3].prompt_tokens]
    for i, c in enumerate(comps):
        k = len(c.tokens)
        assert batch.completions[i, :k].tolist() == c.tokens
        assert batch.mask[i].sum() == k
        np.testing.assert_allclose(batch.behaviour_logp[i, :k], c.logprobs, rtol=1e-6)
    parts = micro_batches(batch, 4)  # 4 sequences -> whole groups of 3: one group each
    assert len(parts) == 2 and parts[0].completions.shape[0] == 3
    # left padding: the shorter prompt is right-aligned
    assert parts[0].prompts.shape == (1, 3) and parts[0].left_padding.tolist() == [0]


def test_skipping_silent_groups_changes_nothing(tiny_model_path):
    rng = np.random.default_rng(1)
    comps = _completions(rng, 4, 3)
    advantages = np.array([0, 0, 0, 0.5, -0.25, -0.25, 0, 0, 0, 1.0, -0.5, -0.5])
    batch = build_batch(comps, advantages, 3)
    config = build_config({"group_size": 3, "lr": 1e-2, "num_iterations": 2, "micro_batch_size": 3,
                           "warmup_steps": 0, "steps": 5})
    all_parts = micro_batches(batch, 3)
    sizes = BatchShape(12, int(batch.mask.sum()), len(all_parts), config.max_tokens)
    results = []
    for parts in (all_parts, micro_batches(groups_with_signal(batch), 3)):
        model, _ = load_policy(str(tiny_model_path))
        mx.random.seed(0)
        prepare_for_training(model, "lora", {"rank": 4})
        metrics = update(model, make_optimizer(config), config, sizes, parts, None, None)
        results.append((dict(tree_flatten(model.trainable_parameters())), metrics))
    assert len(micro_batches(groups_with_signal(batch), 3)) == 2
    (a, ma), (b, mb) = results
    for name in a:
        np.testing.assert_allclose(np.array(a[name]), np.array(b[name]), atol=1e-6, err_msg=name)
    assert abs(ma["loss"] - mb["loss"]) < 1e-6 and abs(ma["grad_norm"] - mb["grad_norm"]) < 1e-5


def test_batch_rows_cover_each_epoch_once_in_a_seeded_order():
    rows = [{"prompt": str(i)} for i in range(10)]
    seen = [r["prompt"] for step in range(1, 6) for r in batch_rows(rows, step, 2, seed=3)]
    assert sorted(seen) == sorted(r["prompt"] for r in rows)  # one full pass, no repeats
    assert seen == [r["prompt"] for step in range(1, 6) for r in batch_rows(rows, step, 2, seed=3)]
    assert seen != [r["prompt"] for step in range(1, 6) for r in batch_rows(rows, step, 2, seed=4)]
