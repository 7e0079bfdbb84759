"""entropy_top_quantile < 1: the tokens that carry the loss are the top fraction of the whole step's
tokens by entropy, whatever the micro-batch size, silent groups skipped or not."""

import math

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from mlx_grpo.config import build_config
from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.trainer import train_step, update_settings
from mlx_grpo.sampling.rollout import Completion
from mlx_grpo.tasks.registry import Task
from mlx_grpo.update.batch import build_batch, groups_with_signal, micro_batch_count, micro_batches
from mlx_grpo.update.losses import BatchShape
from mlx_grpo.update.step import top_entropy_weights, update


def _fresh(path):
    model, tokenizer = load_policy(str(path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4})
    return model, tokenizer


def _weights(model):
    return {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}


def _batch(seed=4):
    rng = np.random.default_rng(seed)
    completions = []
    for i in range(3):
        prompt = [int(t) for t in rng.integers(3, 250, 3 + i)]
        completions += [
            Completion(
                i,
                prompt,
                [int(t) for t in rng.integers(3, 250, int(rng.integers(3, 9)))],
                list(rng.normal(-3, 0.5, 9)),
                "stop",
                "",
            )
            for _ in range(4)
        ]
    for c in completions:
        c.logprobs = c.logprobs[: len(c.tokens)]
    advantages = np.concatenate([rng.normal(size=4), np.zeros(4), rng.normal(size=4)])  # group 1 is silent
    return build_batch(completions, advantages, 4)


def _close(a, b):
    for name in a:
        np.testing.assert_allclose(b[name], a[name], atol=1e-6, err_msg=name)


def test_the_same_tokens_train_at_any_micro_batch_size(tiny_model_path):
    batch = _batch()
    config = build_config({"group_size": 4, "entropy_top_quantile": 0.4, "steps": 5})
    results = []
    for size in (16, 3, 1):
        model, _ = _fresh(tiny_model_path)
        parts = micro_batches(batch, size)
        sizes = BatchShape(
            12, int(batch.mask.sum()), micro_batch_count(3, 4, size), config.sampling.max_tokens
        )
        update(model, optim.SGD(learning_rate=1.0), update_settings(config), sizes, parts, None, None)
        results.append(_weights(model))
    _close(results[0], results[1])
    _close(results[0], results[2])


def test_the_threshold_counts_silent_groups_left_out_of_the_passes(tiny_model_path):
    batch = _batch()
    config = build_config({"group_size": 4, "entropy_top_quantile": 0.4, "steps": 5})
    sizes = BatchShape(12, int(batch.mask.sum()), 3, config.sampling.max_tokens)
    model, _ = _fresh(tiny_model_path)
    every = micro_batches(batch, 4)
    chosen = top_entropy_weights(model, every, [], 0.4, 1.0, None)
    # the top 40% (rounded up) of the step's 'real' tokens, over all three groups together
    assert sum(float(w.sum()) for w in chosen) == math.ceil(0.4 * batch.mask.sum())
    update(model, optim.SGD(learning_rate=1.0), update_settings(config), sizes, every, None, None)
    whole = _weights(model)
    model, _ = _fresh(tiny_model_path)
    signal = micro_batches(groups_with_signal(batch), 4)
    silent = micro_batches(groups_with_signal(batch, silent=True), 4)
    assert len(signal) == 2 and len(silent) == 1
    weights = top_entropy_weights(model, signal, silent, 0.4, 1.0, None)
    update(
        model,
        optim.SGD(learning_rate=1.0),
        update_settings(config),
        sizes,
        signal,
        None,
        None,
        token_weights=weights,
    )
    _close(whole, _weights(model))


def flat_for_one_prompt(prompts, completions, **kw):
    return [1.0 if p == "flat" else float(sum(map(ord, c)) % 97) for p, c in zip(prompts, completions)]


def test_a_training_step_chooses_its_tokens_over_the_whole_step(tiny_model_path):
    """train_step at micro-batch size 16 and 2 (groups cut into pieces), one group silent: the same update."""
    task = Task(
        "t", [{"prompt": p} for p in ("flat", "abc", "xyz")], [], [flat_for_one_prompt], [1.0], None, None, []
    )
    results = []
    for size in (16, 2):
        config = build_config(
            {
                "group_size": 4,
                "batch_size": 3,
                "max_tokens": 8,
                "steps": 2,
                "kl_every": 0,
                "entropy_top_quantile": 0.3,
                "micro_batch_size": size,
                "runaway_penalty": 1.0,
            }
        )
        model, tokenizer = _fresh(tiny_model_path)
        metrics, _ = train_step(model, tokenizer, optim.SGD(learning_rate=1.0), task, config, 1, None)
        assert 0 < metrics["frac_zero_std"] < 1
        results.append(_weights(model))
    _close(*results)
