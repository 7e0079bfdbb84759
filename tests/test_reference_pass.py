"""The reference's log-probs are those of a fixed policy: eval mode, no LoRA dropout."""

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlx_grpo.models.adapters import prepare_for_training, weights_swapped
from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling.rollout import Completion
from mlx_grpo.update.batch import build_batch, micro_batches
from mlx_grpo.update.logprobs import token_logprobs
from mlx_grpo.update.step import reference_logprobs


def test_the_reference_pass_runs_without_dropout_and_leaves_the_mode_alone(tiny_model_path):
    """A refreshed reference keeps LoRA adapters, and their dropout (0.5 here) would draw a fresh mask
    in every pass made in training mode: two passes would disagree, and neither be the reference."""
    model, _ = load_policy(str(tiny_model_path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4, "dropout": 0.5})
    rng = np.random.default_rng(0)
    # a reference whose adapters are not zero (a fresh LoRA's B is, which would hide any dropout)
    ref = tree_unflatten(
        [
            (k, mx.array(rng.normal(0, 0.5, v.shape).astype(np.float32)))
            for k, v in tree_flatten(model.trainable_parameters())
        ]
    )
    prompt = [int(t) for t in rng.integers(3, 250, 5)]
    completions = [
        Completion(0, prompt, [int(t) for t in rng.integers(3, 250, 6)], [-3.0] * 6, "length", "")
        for _ in range(3)
    ]
    parts = micro_batches(build_batch(completions, np.array([1.0, -0.5, -0.5]), 3), 16)
    model.train()
    first = np.array(reference_logprobs(model, parts, ref, 1.0, None)[0])
    second = np.array(reference_logprobs(model, parts, ref, 1.0, None)[0])
    assert model.training  # the update that follows still trains with dropout
    np.testing.assert_array_equal(first, second)
    # the same numbers as a plain forward pass over prompt + completion with the reference's weights, in eval
    # mode
    model.eval()
    with weights_swapped(model, ref):
        for i, c in enumerate(completions):
            logp, _ = token_logprobs(model, mx.array([prompt + c.tokens]))
            np.testing.assert_allclose(first[i], np.array(logp[0, len(prompt) - 1 :]), atol=1e-5)
