"""bnpo's normaliser counts the micro-batches that are trained, not those dropped as fully masked."""

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest

from mlx_grpo.config import build_config
from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.trainer import update_settings
from mlx_grpo.sampling.rollout import Completion
from mlx_grpo.update.batch import RolloutBatch, batch_shape, build_batch, micro_batches
from mlx_grpo.update.step import update


def _loss(path, batch, config) -> float:
    """The bnpo loss of one update on `batch`, micro-batches of one group (2 sequences)."""
    model, _ = load_policy(str(path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4})
    return update(
        model,
        optim.SGD(learning_rate=0.0),
        update_settings(config),
        batch_shape(batch, 2, 8),
        micro_batches(batch, 2),
        None,
        None,
    )["loss"]


def _group(batch: RolloutBatch, i: int) -> RolloutBatch:
    rows = slice(2 * i, 2 * i + 2)
    return RolloutBatch(
        [batch.prompts[i]],
        batch.completions[rows],
        batch.mask[rows],
        batch.behaviour_logp[rows],
        batch.advantages[rows],
        2,
    )


def test_bnpo_averages_over_the_micro_batches_it_trains(tiny_model_path):
    """Three groups, one cut whole (mask_truncated masks every token of it): the bnpo loss is the mean of
    the two trained micro-batches' token means, each worked out alone, not their sum over 3."""
    rng = np.random.default_rng(5)
    completions = []
    for i in range(3):
        prompt = [int(t) for t in rng.integers(3, 250, 4)]
        for _ in range(2):
            k = int(rng.integers(2, 7))
            completions.append(
                Completion(
                    i,
                    prompt,
                    [int(t) for t in rng.integers(3, 250, k)],
                    list(rng.normal(-3, 0.5, k)),
                    "length",
                    "",
                )
            )
    batch = build_batch(completions, np.array([0.5, -0.5, 1.0, -1.0, 0.25, -0.25]), 2)
    batch.mask[2:4] = 0.0  # as mask_truncated leaves a group whose completions were all cut
    assert len(micro_batches(batch, 2)) == 2 and batch_shape(batch, 2, 8).num_micro_batches == 2
    config = build_config({"group_size": 2, "loss": "bnpo", "steps": 5})
    whole = _loss(tiny_model_path, batch, config)
    alone = [_loss(tiny_model_path, _group(batch, i), config) for i in (0, 2)]
    assert whole == pytest.approx(np.mean(alone), rel=1e-5)
    assert abs(whole) > 1e-4
