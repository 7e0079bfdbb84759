"""The output head's log-probs: the taken token's logit less the log-normaliser, with a hand-written gradient.

`_taken_logprobs` reads each taken token's log-prob with a gather and differentiates it with one pass over
the vocabulary (`_taken_slope`: the cotangent at the taken token less cotangent x softmax), with no
log-softmax over the vocabulary and no one-hot scattered into zeros. Checked here against NumPy in
float64, against central differences, and against the plain autodiff computation it replaces
(`_autodiff_*` below: take_along_axis of the scaled logits less their log-normaliser, and
`_previous_frozen_head_chunk`), values and gradients, down to the GRPO update's loss and gradient norm
on the tiny model."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map
from test_update_head_positions import _batch, _lora_model, _settings, _updated

from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.heads import output_head
from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling.rollout import draw_tokens, greedy_tokens
from mlx_grpo.setting_groups import SamplingSettings
from mlx_grpo.update import logprobs
from mlx_grpo.update.logprobs import _logprobs_and_entropy, _project, _taken_slope
from mlx_grpo.update.sft_loss import sft_loss


def _numpy_log_softmax(logits, temperature):
    z = logits.astype(np.float64) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _numpy_logprobs(logits, targets, temperature):
    return np.take_along_axis(_numpy_log_softmax(logits, temperature), targets[..., None], axis=-1)[..., 0]


def _autodiff_logprobs_and_entropy(logits, targets, temperature, entropy_grad=False, with_entropy=True):
    """The log-probs and entropies as plain MLX autodiff computes them: gather, log-normaliser, their
    gradients (a scatter of the cotangent into zeros, and the softmax's)."""
    if logits.dtype in (mx.float16, mx.bfloat16):
        logits = logits.astype(mx.float32)
    z = logits / temperature
    shift = mx.stop_gradient(mx.max(z, axis=-1, keepdims=True))
    weights = mx.exp(z - shift)
    total = weights.sum(axis=-1, keepdims=True)
    lse = (mx.log(total) + shift).squeeze(-1)
    logp = mx.take_along_axis(z, targets[..., None], axis=-1).squeeze(-1) - lse
    if entropy_grad:
        return logp, lse - mx.sum((weights / total) * z, axis=-1)
    probs = mx.stop_gradient(weights / total)
    return logp, mx.stop_gradient(lse) - mx.sum(probs * mx.stop_gradient(z), axis=-1)


def _autodiff_frozen_head_chunk(project, hidden, targets, temperature):
    """The frozen head's log-probs with d logp / d h from MLX's own vjp of the whole softmax."""
    h = mx.stop_gradient(hidden)

    def logp_of(h):
        return _autodiff_logprobs_and_entropy(project(h), targets, temperature)[0]

    logp, (jac,) = mx.vjp(logp_of, [h], [mx.ones(targets.shape)])
    entropy = _autodiff_logprobs_and_entropy(project(h), targets, temperature)[1]
    along = (hidden * mx.stop_gradient(jac)).sum(axis=-1)
    return mx.stop_gradient(logp[0]) + (along - mx.stop_gradient(along)), mx.stop_gradient(entropy)


def _previous_frozen_head_chunk(project, hidden, targets, temperature):
    """The frozen head as it was written before `_taken_slope`: the slope's taken entries put in with
    (1 - exp(logp)) / T."""
    h = mx.stop_gradient(hidden)
    z = project(h) / temperature
    shift = mx.stop_gradient(mx.max(z, axis=-1, keepdims=True))
    weights = mx.exp(z - shift)
    total = weights.sum(axis=-1, keepdims=True)
    lse = (mx.log(total) + shift).squeeze(-1)
    logp = mx.take_along_axis(z, targets[..., None], axis=-1).squeeze(-1) - lse
    entropy = lse - mx.sum(weights * z, axis=-1) / total.squeeze(-1)
    slope = weights * (-1.0 / (temperature * total))
    slope = mx.put_along_axis(
        slope, targets[..., None], ((1 - mx.exp(logp)) / temperature)[..., None], axis=-1
    )
    _, (jac,) = mx.vjp(project, [h], [slope.astype(h.dtype)])
    along = (hidden * mx.stop_gradient(jac)).sum(axis=-1)
    return mx.stop_gradient(logp) + (along - mx.stop_gradient(along)), mx.stop_gradient(entropy)


def _case(rng, shape=(2, 3), vocab=11, scale=4.0):
    logits = (rng.normal(size=shape + (vocab,)) * scale).astype(np.float32)
    return logits, rng.integers(0, vocab, size=shape)


def test_values_match_numpy_and_plain_autodiff():
    rng = np.random.default_rng(0)
    logits, targets = _case(rng, vocab=13)
    logits[0] += 300.0  # far from zero: the normaliser must be shifted
    for temperature in (1.0, 0.7, 1.3):
        want = _numpy_logprobs(logits, targets, temperature)
        for entropy_grad in (False, True):
            logp, entropy = _logprobs_and_entropy(
                mx.array(logits), mx.array(targets), temperature, entropy_grad
            )
            old_logp, old_entropy = _autodiff_logprobs_and_entropy(
                mx.array(logits), mx.array(targets), temperature
            )
            np.testing.assert_allclose(np.array(logp), want, atol=1e-4)
            np.testing.assert_array_equal(np.array(logp), np.array(old_logp))
            np.testing.assert_array_equal(np.array(entropy), np.array(old_entropy))
    # Half-precision logits are scored in float32; sft's loss asks for no entropy.
    logp, entropy = _logprobs_and_entropy(
        mx.array(logits).astype(mx.bfloat16), mx.array(targets), 0.7, with_entropy=False
    )
    halved = np.array(mx.array(logits).astype(mx.bfloat16).astype(mx.float32))
    np.testing.assert_allclose(np.array(logp), _numpy_logprobs(halved, targets, 0.7), atol=1e-4)
    assert logp.dtype == mx.float32 and not np.array(entropy).any()


@pytest.mark.parametrize("scale_shape", [(), (2, 3)])
def test_the_slope_is_the_one_hot_less_the_softmax(scale_shape):
    rng = np.random.default_rng(1)
    logits, targets = _case(rng, vocab=9, scale=2.0)
    scale = rng.normal(size=scale_shape).astype(np.float32)
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    total = weights.sum(axis=-1, keepdims=True)
    got = _taken_slope(mx.array(weights), mx.array(total), mx.array(targets), mx.array(scale))
    probs = np.exp(_numpy_log_softmax(logits, 1.0))
    one_hot = np.arange(9) == targets[..., None]
    np.testing.assert_allclose(np.array(got), np.asarray(scale)[..., None] * (one_hot - probs), atol=1e-6)


def _finite_differences(objective, x, step=1e-6):
    numeric = np.zeros(x.shape)
    for i in np.ndindex(x.shape):
        shift = np.zeros(x.shape)
        shift[i] = step
        numeric[i] = (objective(x + shift) - objective(x - shift)) / (2 * step)
    return numeric


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_the_gradient_matches_finite_differences_and_autodiff(temperature, float64_device):
    rng = np.random.default_rng(2)
    logits, targets = _case(rng, vocab=7, scale=1.5)
    a, b = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    logits64 = logits.astype(np.float64)

    def numpy_logp(x):
        return (a * _numpy_logprobs(x, targets, temperature)).sum()

    def numpy_with_entropy(x):
        log_softmax = _numpy_log_softmax(x, temperature)
        return numpy_logp(x) + (b * -(np.exp(log_softmax) * log_softmax).sum(axis=-1)).sum()

    # MLX's float64 exp is good to about 2e-8 relative, not to float64's rounding.
    for dtype, atol in ((mx.float64, 2e-7), (mx.float32, 2e-5)):
        x, t, wa, wb = (
            mx.array(logits64, dtype=dtype),
            mx.array(targets),
            mx.array(a, dtype),
            mx.array(b, dtype),
        )
        for entropy_grad, numpy_objective in ((False, numpy_logp), (True, numpy_with_entropy)):

            def objective(x, score=_logprobs_and_entropy):
                logp, entropy = score(x, t, temperature, entropy_grad)
                return (wa * logp).sum() + (wb * entropy).sum()

            numeric = _finite_differences(numpy_objective, logits64)
            got = mx.grad(objective)(x)
            np.testing.assert_allclose(np.array(got.astype(mx.float64)), numeric, atol=atol)
            for transform in (mx.compile, mx.checkpoint):
                np.testing.assert_allclose(
                    np.array(transform(mx.grad(objective))(x)), np.array(got), atol=1e-12
                )
            autodiff = mx.grad(lambda x: objective(x, _autodiff_logprobs_and_entropy))(x)
            np.testing.assert_allclose(
                np.array(got), np.array(autodiff), atol=1e-6 if dtype == mx.float32 else 1e-14
            )


def test_the_sampler_s_log_probs_match_numpy(cpu_device):
    """The behaviour log-prob of a drawn token: log softmax(logits / T) at that token of the unfiltered
    distribution, with a filter on or off, and greedy decoding's at T = 1."""
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=(4, 300)) * 3).astype(np.float32)
    keys = mx.array(rng.integers(0, 2**32, size=(4, 2), dtype=np.uint64).astype(np.uint32))
    for temperature in (1.0, 0.7):
        for filters in ({}, {"top_k": 20}, {"top_p": 0.9}):
            settings = SamplingSettings(temperature=temperature, **filters)
            tokens, logp = draw_tokens(mx.array(logits), keys, settings)
            want = _numpy_logprobs(logits, np.array(tokens).astype(np.int64), temperature)
            np.testing.assert_allclose(np.array(logp), want, atol=2e-5, err_msg=str((temperature, filters)))
    tokens, logp = greedy_tokens(mx.array(logits))
    np.testing.assert_array_equal(np.array(tokens), logits.argmax(axis=-1))
    np.testing.assert_allclose(
        np.array(logp), _numpy_logprobs(logits, logits.argmax(axis=-1), 1.0), atol=2e-5
    )


def _model_grads(model, loss):
    return {k: np.array(v) for k, v in tree_flatten(nn.value_and_grad(model, loss)(model)[1])}


@pytest.mark.parametrize("quantized", [False, True])
def test_the_head_through_a_trainable_or_frozen_tied_head_is_autodiff_s(
    tiny_model_path, quantized, cpu_device, monkeypatch
):
    """The tied embedding as the head, float or 4-bit: log-probs against NumPy on the head's own weights, and
    the frozen head's forward-pass gradient and a trainable head's backward (whole and chunked) against
    autodiff."""
    model, _ = load_policy(str(tiny_model_path))
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
    head = output_head(model)
    embed = head[0]
    table = (
        mx.dequantize(embed.weight, embed.scales, embed.biases, embed.group_size, embed.bits)
        if quantized
        else embed.weight
    )
    rng = np.random.default_rng(4)
    hidden = rng.normal(size=(2, 5, model.args.hidden_size)).astype(np.float32)
    targets = mx.array(rng.integers(0, model.args.vocab_size, size=(2, 5)))
    a = mx.array(rng.normal(size=(2, 5)).astype(np.float32))
    logits = hidden.astype(np.float64) @ np.array(table).astype(np.float64).T
    logp, _ = _project(head, mx.array(hidden), targets, 0.7, None, differentiated=True)
    np.testing.assert_allclose(np.array(logp), _numpy_logprobs(logits, np.array(targets), 0.7), atol=1e-4)

    def grad_of_hidden():
        return np.array(
            mx.grad(lambda h: (a * _project(head, h, targets, 0.7, 2, differentiated=True)[0]).sum())(
                mx.array(hidden)
            )
        )

    frozen = grad_of_hidden()
    for oracle in (_autodiff_frozen_head_chunk, _previous_frozen_head_chunk):
        monkeypatch.setattr(logprobs, "_frozen_head_chunk", oracle)
        np.testing.assert_allclose(frozen, grad_of_hidden(), rtol=1e-5, atol=1e-6)
    monkeypatch.undo()
    if quantized:
        return  # a quantized table is not trained
    prepare_for_training(model, "full")
    for chunk in (None, 2):

        def loss(m):
            return (
                a * _project(output_head(m), mx.array(hidden), targets, 0.7, chunk, differentiated=True)[0]
            ).sum()

        ours = _model_grads(model, loss)
        monkeypatch.setattr(logprobs, "_logprobs_and_entropy", _autodiff_logprobs_and_entropy)
        theirs = _model_grads(model, loss)
        monkeypatch.undo()
        assert ours.keys() == theirs.keys() and np.abs(ours["model.embed_tokens.weight"]).max() > 1e-4
        for name in ours:
            np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-7, err_msg=name)


def _grad_norm(grads: dict) -> float:
    return float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads.values())))


@pytest.mark.parametrize("training, entropy_coef", [("lora", 0.0), ("lora", 0.05), ("full", 0.0)])
def test_the_grpo_update_has_the_autodiff_head_s_loss_and_gradient(
    tiny_model_path, cpu_device, monkeypatch, training, entropy_coef
):
    """End to end on the tiny model: LoRA (the frozen head's gradient in the forward pass), an entropy bonus
    (the entropy's own gradient), full fine-tuning (the trainable tied head's backward, chunked)."""
    if training == "lora":
        model = _lora_model(tiny_model_path)
    else:
        model, _ = load_policy(str(tiny_model_path))
        prepare_for_training(model, "full")
        model.train()
    batch = _batch(model, 0.8)
    settings = _settings("grpo", 0.1, entropy_coef)
    weights = tree_map(lambda w: w, model.parameters())
    slopes = []
    real_slope = logprobs._taken_slope
    monkeypatch.setattr(logprobs, "_taken_slope", lambda *a: slopes.append(a[0].shape) or real_slope(*a))
    metrics, grads = _updated(model, batch, settings, 0.8, 1.0, 3, 2)
    assert slopes  # the head's gradient came from the slope
    model.update(weights)
    monkeypatch.setattr(logprobs, "_logprobs_and_entropy", _autodiff_logprobs_and_entropy)
    monkeypatch.setattr(logprobs, "_frozen_head_chunk", _previous_frozen_head_chunk)
    slopes.clear()
    old_metrics, old_grads = _updated(model, batch, settings, 0.8, 1.0, 3, 2)
    assert not slopes
    assert metrics["loss"] == pytest.approx(old_metrics["loss"], rel=1e-6, abs=1e-8)
    assert metrics["grad_norm"] == pytest.approx(old_metrics["grad_norm"], rel=1e-5)
    assert _grad_norm(grads) == pytest.approx(_grad_norm(old_grads), rel=1e-5) and _grad_norm(grads) > 0
    assert grads.keys() == old_grads.keys()
    scale = max(np.abs(g).max() for g in old_grads.values())
    for name, g in old_grads.items():
        np.testing.assert_allclose(grads[name], g, rtol=1e-4, atol=1e-6 * scale, err_msg=name)


def test_sft_s_loss_and_gradient_are_autodiff_s(tiny_model_path, cpu_device, monkeypatch):
    """sft's loss (no entropy worked out) through a trainable tied head: the autodiff head's loss and
    gradients, and the loss is NumPy's cross-entropy of the model's own logits."""
    model, _ = load_policy(str(tiny_model_path))
    prepare_for_training(model, "full")
    rng = np.random.default_rng(5)
    tokens = mx.array(rng.integers(3, 250, size=(2, 8)))
    trained = mx.array((rng.random((2, 8)) > 0.4).astype(np.float32))
    count = float(np.array(trained[:, 1:]).sum())
    logits = np.array(model(tokens[:, :-1])).astype(np.float64)
    flags = np.array(trained[:, 1:]) > 0
    want = -_numpy_logprobs(logits, np.array(tokens[:, 1:]), 1.0)[flags].sum() / count
    loss, grads = nn.value_and_grad(model, lambda m: sft_loss(m, tokens, trained, count, chunk_size=3))(model)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    monkeypatch.setattr(logprobs, "_logprobs_and_entropy", _autodiff_logprobs_and_entropy)
    import mlx_grpo.update.sft_loss as sft_module

    monkeypatch.setattr(sft_module, "_logprobs_and_entropy", _autodiff_logprobs_and_entropy)
    old_loss, old_grads = nn.value_and_grad(
        model, lambda m: sft_loss(m, tokens, trained, count, chunk_size=3)
    )(model)
    assert loss.item() == pytest.approx(old_loss.item(), rel=1e-6)
    ours, theirs = dict(tree_flatten(grads)), dict(tree_flatten(old_grads))
    assert ours.keys() == theirs.keys()
    scale = max(np.abs(np.array(g)).max() for g in theirs.values())
    for name in theirs:
        np.testing.assert_allclose(
            np.array(ours[name]), np.array(theirs[name]), rtol=1e-4, atol=1e-6 * scale, err_msg=name
        )
