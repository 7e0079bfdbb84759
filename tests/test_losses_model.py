"""Through the tiny model: token log-probs against NumPy (whole and chunked), and the loss's gradient
against central differences and unchunked."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.config import TrainConfig
from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.step_update import update_settings
from mlx_grpo.update.logprobs import token_logprobs
from mlx_grpo.update.losses import BatchShape, policy_loss


def _numpy_logprobs(logits, targets, temperature):
    z = logits / temperature
    z = z - z.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return np.take_along_axis(logp_all, targets[..., None], -1)[..., 0]


def test_token_logprobs_match_numpy_and_chunking(tiny_model_path):
    model, _ = load_policy(str(tiny_model_path))
    tokens = mx.array(np.random.default_rng(0).integers(3, 200, (3, 11)), dtype=mx.int32)
    logits = np.array(model(tokens[:, :-1]), dtype=np.float64)
    expected = _numpy_logprobs(logits, np.array(tokens[:, 1:]), 0.7)
    full, entropy = token_logprobs(model, tokens, temperature=0.7)
    chunked, chunked_entropy = token_logprobs(model, tokens, temperature=0.7, chunk_size=4)
    np.testing.assert_allclose(np.array(full), expected, atol=1e-5)
    np.testing.assert_allclose(np.array(chunked), expected, atol=1e-5)
    np.testing.assert_allclose(np.array(chunked_entropy), np.array(entropy), atol=1e-5)


def _loss_fn(tokens, mask, behaviour, adv, chunk=None):
    shape = BatchShape(tokens.shape[0], int(mask.sum().item()), 1, tokens.shape[1])

    def fn(model):
        logp, _ = token_logprobs(model, tokens, temperature=0.9, chunk_size=chunk)
        settings = update_settings(TrainConfig.from_flat({"beta": 0.1})).loss  # grpo, epsilon 0.2 both sides
        return policy_loss(logp, behaviour, adv, mask, shape, settings, ref_logp=behaviour - 0.1)[0]

    return fn


def test_gradient_matches_finite_differences(tiny_model_path, float64_device):
    """Autodiff through the model and the clipped objective vs central differences.

    Per trainable tensor, along a direction d: (L(w + h d) - L(w - h d)) / 2h
    must equal <grad, d>. In float64; MLX's fused RMSNorm still rounds to
    ~1e-7 internally, which a directional step of h = 3e-3 keeps negligible.
    """
    model, _ = load_policy(str(tiny_model_path))
    mx.random.seed(1)
    prepare_for_training(model, "lora", {"rank": 4, "scale": 2.0})
    # random (not zero) lora_b so the adapter path is active
    model.update(nn.utils.tree_map(lambda p: mx.random.normal(p.shape) * 0.1, model.trainable_parameters()))
    model.set_dtype(mx.float64)
    rng = np.random.default_rng(3)
    tokens = mx.array(rng.integers(3, 200, (2, 8)), dtype=mx.int32)
    mask = mx.array(np.array([[0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 0]], dtype=np.float64))
    base_logp, _ = token_logprobs(model, tokens, temperature=0.9)
    # behaviour log-probs away from the current ones: ratios != 1, some clipped
    behaviour = base_logp + mx.array(rng.normal(0, 0.3, base_logp.shape))
    adv = mx.array([1.0, -0.7], dtype=mx.float64)
    loss_fn = _loss_fn(tokens, mask, behaviour, adv)

    _, grads = nn.value_and_grad(model, loss_fn)(model)
    flat_grads = dict(tree_flatten(grads))
    params = dict(tree_flatten(model.trainable_parameters()))
    assert len(params) == 28  # 2 blocks x 7 projections x (lora_a, lora_b)
    h = 3e-3
    for name, value in params.items():
        w, g = np.array(value), np.array(flat_grads[name])
        # Along the gradient plus a random unit vector: the derivative is at least
        # of the gradient's size, far above the rounding noise, and a gradient
        # wrong in any component changes it.
        r = rng.normal(size=w.shape)
        d = g / np.linalg.norm(g) + r / np.linalg.norm(r)

        def loss_at(step):
            model.load_weights([(name, mx.array(w + step * d))], strict=False)
            return loss_fn(model).item()

        numeric = (loss_at(h) - loss_at(-h)) / (2 * h)
        model.load_weights([(name, mx.array(w))], strict=False)
        analytic = float((g * d).sum())
        assert analytic == pytest.approx(numeric, rel=2e-3, abs=3e-5), name
        assert np.linalg.norm(g) > 1e-3, name  # a real, non-vanishing gradient was compared


def test_chunked_gradient_equals_unchunked(tiny_model_path):
    model, _ = load_policy(str(tiny_model_path))
    model.unfreeze()  # full fine-tuning: the tied output head gets gradients through the chunks
    rng = np.random.default_rng(5)
    tokens = mx.array(rng.integers(3, 200, (2, 13)), dtype=mx.int32)
    mask = mx.ones((2, 12))
    behaviour = mx.zeros((2, 12)) - 5.0
    adv = mx.array([0.3, -0.2])
    _, g_full = nn.value_and_grad(model, _loss_fn(tokens, mask, behaviour, adv))(model)
    _, g_chunk = nn.value_and_grad(model, _loss_fn(tokens, mask, behaviour, adv, chunk=5))(model)
    full, chunk = dict(tree_flatten(g_full)), dict(tree_flatten(g_chunk))
    assert "model.embed_tokens.weight" in full
    for name in full:
        np.testing.assert_allclose(np.array(chunk[name]), np.array(full[name]), atol=1e-5, err_msg=name)
