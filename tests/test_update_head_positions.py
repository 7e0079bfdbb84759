"""The GRPO update sends only the masked-in completion positions through the output head.

In a multi-turn episode most completion tokens are the environment's observations (mask 0); the
update, the reference pass and the top-entropy pass score only the others. The loss, its statistics
and its gradients are those of scoring every position, here worked out independently: each row's
prompt and completion through the plain model, the loss written out in MLX."""

import math
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from mlx_grpo.models.adapters import adapters_disabled, prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.update import logprobs
from mlx_grpo.update.batch import RolloutBatch, micro_batches
from mlx_grpo.update.losses import BatchShape, LossSettings, policy_loss
from mlx_grpo.update.step import UpdateSettings, reference_logprobs, update

GROUP = 3
# Each row: the model's turn, the environment's observation (mask 0), a second turn, then padding.
MASKS = [
    [1, 1, 0, 0, 0, 1, 1, 0, 0],
    [1, 0, 0, 0, 1, 1, 1, 1, 0],
    [1, 1, 1, 0, 0, 0, 0, 1, 0],
    [0, 0, 0, 0, 0, 0, 0, 0, 0],  # cut at its budget and masked whole (mask_truncated)
    [1, 1, 1, 1, 0, 0, 1, 0, 0],
    [1, 0, 0, 1, 0, 0, 1, 0, 1],
]


class Recording:
    """An optimizer that keeps the gradients it is given and moves nothing."""

    state: dict = {}
    grads = None

    def update(self, model, grads):
        self.grads = {k: np.array(v) for k, v in tree_flatten(grads)}


def _lora_model(path):
    model, _ = load_policy(str(path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4})
    # Adapters moved off their zero start: the policy differs from the reference (adapters off).
    model.update(tree_map(lambda w: w + 0.02, model.trainable_parameters()))
    model.train()
    return model


def _full_logprobs(model, batch: RolloutBatch, temperature: float):
    """(B, K) log-probs and entropies of every completion position: each row's prompt and completion
    through the model whole, the softmax written out."""
    logps, entropies = [], []
    width = batch.completions.shape[1]
    for i, row in enumerate(batch.completions):
        prompt = batch.prompts[i // batch.group_size]
        logits = model(mx.array([prompt + row.tolist()]))[0, len(prompt) - 1 : len(prompt) - 1 + width]
        z = logits.astype(mx.float32) / temperature
        norm = mx.logsumexp(z, axis=-1)
        logps.append(mx.take_along_axis(z, mx.array(row)[:, None], axis=-1)[:, 0] - norm)
        entropies.append(norm - (mx.softmax(z, axis=-1) * z).sum(axis=-1))
    return mx.stack(logps), mx.stack(entropies)


def _batch(model, temperature, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.array(MASKS, dtype=np.float32)
    prompts = [[int(t) for t in rng.integers(3, 250, 4)], [int(t) for t in rng.integers(3, 250, 6)]]
    completions = rng.integers(3, 250, mask.shape).astype(np.int32)
    advantages = np.array([0.8, -0.5, -0.3, 1.1, -0.6, -0.5], dtype=np.float32)
    batch = RolloutBatch(prompts, completions, mask, np.zeros_like(mask), advantages, GROUP)
    with _eval(model):
        logp, _ = _full_logprobs(model, batch, temperature)
    # Near the policy on its own tokens, so that some ratios clip; 0 on the observations; the masked
    # row keeps what its sampler recorded.
    behaviour = np.array(logp) + rng.normal(0, 0.3, mask.shape).astype(np.float32)
    batch.behaviour_logp = np.where(mask > 0, behaviour, 0.0).astype(np.float32)
    batch.behaviour_logp[3] = np.array(logp)[3] - 0.1
    return batch


@contextmanager
def _eval(model):
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def _top_entropy_weights(entropy: np.ndarray, mask: np.ndarray, quantile: float) -> np.ndarray:
    values = np.sort(entropy[mask > 0])[::-1]
    threshold = values[max(1, math.ceil(quantile * values.size - 1e-9)) - 1]
    return ((entropy >= threshold) & (mask > 0)).astype(np.float32)


def _expected(model, batch, s: LossSettings, temperature, quantile):
    """(loss, statistics, gradients) of the whole batch, every position scored."""
    mask = mx.array(batch.mask)
    tokens = mask.sum()
    behaviour, adv = mx.array(batch.behaviour_logp), mx.array(batch.advantages)[:, None]
    with _eval(model), adapters_disabled(model):
        ref, _ = _full_logprobs(model, batch, temperature)
    with _eval(model):
        _, watched = _full_logprobs(model, batch, temperature)
    weight = mx.array(_top_entropy_weights(np.array(watched), batch.mask, quantile))
    stats = {}

    def loss_fn(model):
        logp, entropy = _full_logprobs(model, batch, temperature)
        ratio = mx.exp(logp - behaviour)
        term = -mx.minimum(ratio * adv, mx.clip(ratio, 1 - s.epsilon_low, 1 + s.epsilon_high) * adv) * weight
        kl = mx.exp(ref - logp) - (ref - logp) - 1
        term = term + s.beta * kl - s.entropy_coef * entropy
        clipped = ((ratio < 1 - s.epsilon_low) & (adv < 0)) | ((ratio > 1 + s.epsilon_high) & (adv > 0))
        stats.update(
            {
                "ratio/mean": (ratio * mask).sum() / tokens,
                "kl": (kl * mask).sum() / tokens,
                "entropy": (entropy * mask).sum() / tokens,
                "clip_fraction": (clipped * mask).sum() / tokens,
            }
        )
        if s.loss_type == "grpo":
            return ((term * mask).sum(axis=1) / mx.maximum(mask.sum(axis=1), 1)).sum() / len(batch.advantages)
        return (term * mask).sum() / tokens  # dapo

    loss, grads = nn.value_and_grad(model, loss_fn)(model)
    return (
        loss.item(),
        {k: v.item() for k, v in stats.items()},
        {k: np.array(v) for k, v in tree_flatten(grads)},
    )


def _settings(loss_type, beta, entropy_coef):
    return LossSettings(
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=0.28,
        delta=None,
        beta=beta,
        sapo_tau_pos=1.0,
        sapo_tau_neg=1.05,
        entropy_coef=entropy_coef,
        guide_shaping=0.0,
    )


def _updated(model, batch, settings, temperature, quantile, size, chunk):
    """The update's (metrics, gradients) on `batch` cut into micro-batches of `size` rows."""
    parts = micro_batches(batch, size)
    refs = reference_logprobs(model, parts, None, temperature, chunk) if settings.beta > 0 else None
    config = UpdateSettings(
        settings,
        temperature,
        num_iterations=1,
        max_grad_norm=1e9,
        entropy_coef=settings.entropy_coef,
        entropy_top_quantile=quantile,
    )
    sizes = BatchShape(len(batch.advantages), int(batch.mask.sum()), len(parts), batch.mask.shape[1])
    optimizer = Recording()
    metrics = update(model, optimizer, config, sizes, parts, refs, chunk)
    return metrics, optimizer.grads


@pytest.mark.parametrize(
    "loss_type, beta, entropy_coef, quantile, size, chunk",
    [
        ("grpo", 0.1, 0.0, 0.6, 6, None),  # the frozen-head gradient, the reference and the top-entropy pass
        ("grpo", 0.1, 0.0, 1.0, 2, 1),  # a cut group's pieces, the gathered positions a few at a time
        ("dapo", 0.0, 0.05, 1.0, 3, 2),  # an entropy bonus: the entropy's own gradient
    ],
)
def test_scoring_the_masked_in_positions_alone_changes_no_number(
    tiny_model_path, cpu_device, loss_type, beta, entropy_coef, quantile, size, chunk
):
    model = _lora_model(tiny_model_path)
    temperature = 0.8
    batch = _batch(model, temperature)
    settings = _settings(loss_type, beta, entropy_coef)
    loss, stats, grads = _expected(model, batch, settings, temperature, quantile)
    metrics, got = _updated(model, batch, settings, temperature, quantile, size, chunk)
    assert metrics["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7)
    assert 0 < metrics["clip_fraction"] < 1  # some tokens clipped, so the test sees the clip
    for name in ("ratio/mean", "entropy", "clip_fraction") + (("kl",) if beta > 0 else ()):
        assert metrics[name] == pytest.approx(stats[name], rel=1e-5, abs=1e-7), name
    assert got.keys() == grads.keys() and len(got) == 2 * 2 * 7  # lora_a and lora_b of 7 linears in 2 layers
    scale = max(np.abs(g).max() for g in grads.values())
    assert scale > 0
    for name, g in grads.items():
        np.testing.assert_allclose(got[name], g, rtol=1e-5, atol=1e-6 * scale, err_msg=name)


def test_the_head_sees_only_the_masked_in_positions(tiny_model_path, monkeypatch):
    model = _lora_model(tiny_model_path)
    batch = _batch(model, 1.0)
    rows = []
    real = logprobs._project
    monkeypatch.setattr(
        logprobs,
        "_project",
        lambda head, hidden, *a, **kw: rows.append(hidden.shape[:2]) or real(head, hidden, *a, **kw),
    )
    _updated(model, batch, _settings("grpo", 0.1, 0.0), 1.0, 0.5, 6, None)
    # The reference pass, the top-entropy pass and the update each score the 22 masked-in tokens of 54.
    assert rows == [(1, int(batch.mask.sum()))] * 3 and batch.mask.sum() == 22


def test_a_micro_batch_with_nothing_masked_in_has_zero_gradients(tiny_model_path, cpu_device):
    model = _lora_model(tiny_model_path)
    batch = _batch(model, 1.0)
    part = micro_batches(batch, 6)[0]
    part.mask = mx.zeros(part.mask.shape)
    settings = _settings("grpo", 0.1, 0.0)
    refs = reference_logprobs(model, [part], None, 1.0, None)
    assert not np.array(refs[0]).any()
    config = UpdateSettings(
        settings, 1.0, num_iterations=1, max_grad_norm=1e9, entropy_coef=0.0, entropy_top_quantile=0.5
    )
    optimizer = Recording()
    metrics = update(model, optimizer, config, BatchShape(6, 0, 1, 9), [part], refs, None)
    assert metrics["loss"] == 0.0 and metrics["ratio/mean"] is None
    assert len(optimizer.grads) == 2 * 2 * 7 and all(not g.any() for g in optimizer.grads.values())


def test_an_unscored_position_leaks_into_no_sum():
    """A position off the mask reads log-prob 0; however unlikely its behaviour token, its ratio stays out."""
    settings = _settings("grpo", 0.1, 0.0)
    logp = mx.array([[-1.0, 0.0, -2.0]])
    mask = mx.array([[1.0, 0.0, 1.0]])
    adv = mx.array([-0.5])
    sizes = BatchShape(1, 2, 1, 3)
    unlikely = mx.array([[-1.2, -120.0, -1.9]])  # exp(120) overflows float32
    plain = mx.array([[-1.2, 0.0, -1.9]])
    ref = mx.array([[-1.1, 0.0, -2.1]])
    loss, stats = policy_loss(logp, unlikely, adv, mask, sizes, settings, ref_logp=ref)
    expected, expected_stats = policy_loss(logp, plain, adv, mask, sizes, settings, ref_logp=ref)
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx(expected.item(), rel=1e-6)
    for k in expected_stats:
        assert stats[k].item() == pytest.approx(expected_stats[k].item(), rel=1e-6), k
    grad = mx.grad(lambda lp: policy_loss(lp, unlikely, adv, mask, sizes, settings, ref_logp=ref)[0])(logp)
    assert np.isfinite(np.array(grad)).all() and np.array(grad)[0, 1] == 0.0


def test_the_watched_kl_reads_no_unscored_position():
    """kl_every's KL reads the reference pass, which puts 0 off the mask: an unlikely behaviour token there
    stays out of it."""
    from mlx_grpo.run.step_update import _kl_to_reference
    from mlx_grpo.update.batch import MicroBatch

    mask = mx.array([[1.0, 0.0, 1.0]])
    part = MicroBatch(
        mx.zeros((1, 1), mx.int32),
        mx.array([0]),
        mx.zeros((1, 3), mx.int32),
        mask,
        mx.array([[-1.0, -120.0, -2.0]]),
        mx.array([0.5]),
        1,
    )
    ref = mx.array([[-1.5, 0.0, -1.0]])
    expected = np.mean([math.exp(d) - d - 1 for d in (-0.5, 1.0)])
    assert _kl_to_reference([part], [ref]) == pytest.approx(expected, rel=1e-6)
