"""The objective against an independent NumPy implementation, and gradients
against finite differences."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.logprobs import token_logprobs
from mlx_grpo.losses import LOSS_TYPES, BatchShape, kl_k3, policy_loss
from mlx_grpo.policy import load_policy, prepare_for_training


def numpy_loss(logp, old, adv, mask, loss_type, eps_low, eps_high, beta, ref, max_tokens, micro_batches):
    """Straight from the formulas in DESIGN.md, one micro-batch = the whole batch
    except for bnpo, which normalises by the micro-batch's own token count."""
    ratio = np.exp(logp - old)
    a = adv[:, None]
    per_token = -np.minimum(ratio * a, np.clip(ratio, 1 - eps_low, 1 + eps_high) * a)
    if beta > 0:
        per_token = per_token + beta * (np.exp(ref - logp) - (ref - logp) - 1)
    if loss_type == "grpo":
        return np.mean([(per_token[i] * mask[i]).sum() / mask[i].sum() for i in range(len(adv))])
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (len(adv) * max_tokens)
    if loss_type == "dapo":
        return (per_token * mask).sum() / mask.sum()
    if loss_type == "bnpo":
        # mean over micro-batches of each micro-batch's token mean
        parts = np.array_split(np.arange(len(adv)), micro_batches)
        return np.mean([(per_token[p] * mask[p]).sum() / mask[p].sum() for p in parts])
    raise ValueError(loss_type)


def random_inputs(seed, n=6, t=9):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 1.0, (n, t))
    # ratios spread well outside [0.8, 1.2] so both clip branches fire
    logp = old + rng.normal(0.0, 0.4, (n, t))
    ref = old + rng.normal(0.0, 0.3, (n, t))
    adv = rng.normal(0.0, 1.0, n)
    mask = (rng.random((n, t)) < 0.75).astype(np.float64)
    mask[:, 0] = 1.0  # every sequence has at least one token
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_loss_matches_numpy_with_clipping(loss_type, beta):
    logp, old, ref, adv, mask = random_inputs(seed=hash((loss_type, beta)) % 1000)
    eps_low, eps_high, max_tokens = 0.2, 0.28, 12
    ratio = np.exp(logp - old)
    assert ((ratio > 1.28) & (mask > 0)).any() and ((ratio < 0.8) & (mask > 0)).any()

    micro = 2
    parts = np.array_split(np.arange(len(adv)), micro)
    shape = BatchShape(num_sequences=len(adv), num_tokens=int(mask.sum()), num_micro_batches=micro,
                       max_tokens=max_tokens)
    total, clipped = 0.0, 0.0
    for p in parts:
        loss, stats = policy_loss(
            mx.array(logp[p], dtype=mx.float32), mx.array(old[p], dtype=mx.float32),
            mx.array(adv[p], dtype=mx.float32), mx.array(mask[p], dtype=mx.float32), shape,
            loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, beta=beta,
            ref_logp=mx.array(ref[p], dtype=mx.float32),
        )
        total += loss.item()
        clipped += stats["clipped"].item()

    expected = numpy_loss(logp, old, adv, mask, loss_type, eps_low, eps_high, beta, ref, max_tokens, micro)
    assert total == pytest.approx(expected, rel=1e-5, abs=1e-6)

    a = adv[:, None]
    expected_clipped = (((ratio > 1 + eps_high) & (a > 0)) | ((ratio < 1 - eps_low) & (a < 0))) * mask
    assert clipped == expected_clipped.sum() > 0


def test_ratio_one_gives_plain_policy_gradient():
    # With logp == behaviour logp the gradient wrt logp is -A / n_i per token (grpo).
    logp = mx.array([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]])
    mask = mx.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = mx.array([0.5, -1.0])
    shape = BatchShape(2, 5, 1, 3)
    grad = mx.grad(lambda lp: policy_loss(lp, mx.stop_gradient(lp), adv, mask, shape)[0])(logp)
    expected = np.array([[-0.5 / 2, -0.5 / 2, 0.0], [1 / 3, 1 / 3, 1 / 3]]) / 2
    np.testing.assert_allclose(np.array(grad), expected, rtol=1e-6)


def test_k3_is_nonnegative_and_zero_at_equality():
    logp = mx.array([-1.0, -2.0, -3.0])
    assert np.allclose(np.array(kl_k3(logp, logp)), 0.0)
    ref = mx.array([-0.5, -2.5, -1.0])
    k3 = np.array(kl_k3(logp, ref))
    d = np.array(ref) - np.array(logp)
    np.testing.assert_allclose(k3, np.exp(d) - d - 1, rtol=1e-6)
    assert (k3 > 0).all()


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
        return policy_loss(logp, behaviour, adv, mask, shape, epsilon_low=0.2, epsilon_high=0.2, beta=0.1,
                           ref_logp=behaviour - 0.1)[0]
    return fn


def test_gradient_matches_finite_differences(tiny_model_path):
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
