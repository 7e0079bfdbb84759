"""Prompt-shared log-probs equal the plain whole-sequence forward pass, values and gradients."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.update.logprobs import _logprobs_and_entropy, completion_logprobs, token_logprobs


def _numpy_logprobs_and_entropy(logits, targets, temperature):
    z = logits.astype(np.float64) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    logp = np.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
    return logp, -(np.exp(logp_all) * logp_all).sum(axis=-1)


def test_logprobs_and_entropy_match_numpy_with_large_logits():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 11)).astype(np.float32) * 4
    logits[0] += 500.0  # far from zero: the normaliser must be shifted
    targets = rng.integers(0, 11, size=(2, 3))
    for temperature in (1.0, 0.7):
        want_logp, want_entropy = _numpy_logprobs_and_entropy(logits, targets, temperature)
        for entropy_grad in (False, True):
            logp, entropy = _logprobs_and_entropy(
                mx.array(logits), mx.array(targets), temperature, entropy_grad
            )
            np.testing.assert_allclose(np.array(logp), want_logp, atol=1e-4)
            np.testing.assert_allclose(np.array(entropy), want_entropy, atol=1e-4)


def test_logprob_and_entropy_gradients_match_finite_differences():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
    targets = rng.integers(0, 7, size=(2, 3))
    a, b = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))

    def numpy_objective(x):
        logp, entropy = _numpy_logprobs_and_entropy(x, targets, 0.8)
        return (a * logp + b * entropy).sum()

    numeric = np.zeros(logits.shape)
    for i in np.ndindex(logits.shape):
        step = np.zeros(logits.shape)
        step[i] = 1e-5
        numeric[i] = (numpy_objective(logits + step) - numpy_objective(logits - step)) / 2e-5

    def objective(x, entropy_grad):
        logp, entropy = _logprobs_and_entropy(x, mx.array(targets), 0.8, entropy_grad)
        return (mx.array(a, dtype=mx.float32) * logp + mx.array(b, dtype=mx.float32) * entropy).sum()

    with_entropy = np.array(mx.grad(lambda x: objective(x, True))(mx.array(logits)))
    np.testing.assert_allclose(with_entropy, numeric, atol=2e-4)
    # Watched only: the entropy adds nothing to the gradient.
    numeric_logp_only = np.zeros(logits.shape)
    for i in np.ndindex(logits.shape):
        step = np.zeros(logits.shape)
        step[i] = 1e-5
        plus = (a * _numpy_logprobs_and_entropy(logits + step, targets, 0.8)[0]).sum()
        minus = (a * _numpy_logprobs_and_entropy(logits - step, targets, 0.8)[0]).sum()
        numeric_logp_only[i] = (plus - minus) / 2e-5
    watched = np.array(mx.grad(lambda x: objective(x, False))(mx.array(logits)))
    np.testing.assert_allclose(watched, numeric_logp_only, atol=2e-4)


def _case(rng, group_size=3):
    prompts = [
        [int(t) for t in rng.integers(3, 250, n)] for n in (5, 9, 2)
    ]  # different lengths: left padding
    completions = [
        [int(t) for t in rng.integers(3, 250, rng.integers(1, 7))] for _ in range(len(prompts) * group_size)
    ]
    width = max(map(len, prompts))
    padded = np.zeros((len(prompts), width), dtype=np.int32)
    for i, p in enumerate(prompts):
        padded[i, width - len(p) :] = p
    k = max(map(len, completions))
    comp = np.zeros((len(completions), k), dtype=np.int32)
    mask = np.zeros((len(completions), k), dtype=np.float32)
    for i, c in enumerate(completions):
        comp[i, : len(c)], mask[i, : len(c)] = c, 1
    left = mx.array([width - len(p) for p in prompts])
    return prompts, completions, mx.array(padded), left, mx.array(comp), mx.array(mask)


def _plain(model, prompts, completions, group_size, temperature):
    rows = []
    for i, c in enumerate(completions):
        p = prompts[i // group_size]
        logp, _ = token_logprobs(model, mx.array([p + c]), temperature)
        rows.append(logp[0, len(p) - 1 :])
    return rows


def test_shared_prompt_matches_plain_forward(tiny_model_path):
    model, _ = load_policy(str(tiny_model_path))
    prompts, completions, padded, left, comp, mask = _case(np.random.default_rng(0))
    for chunk in (None, 2):
        shared, entropy = completion_logprobs(model, padded, left, comp, 3, temperature=0.8, chunk_size=chunk)
        assert not np.isnan(np.array(shared)).any() and not np.isnan(np.array(entropy)).any()
        for i, row in enumerate(_plain(model, prompts, completions, 3, 0.8)):
            np.testing.assert_allclose(np.array(shared[i, : len(completions[i])]), np.array(row), atol=2e-5)


def _lora_model_and_case(path, seed: int):
    """The tiny model with random (non-zero) LoRA adapters, a case and random per-token loss weights."""
    model, _ = load_policy(str(path))
    mx.random.seed(seed)
    prepare_for_training(model, "lora", {"rank": 4, "scale": 2.0})
    model.update(nn.utils.tree_map(lambda p: mx.random.normal(p.shape) * 0.1, model.trainable_parameters()))
    prompts, completions, padded, left, comp, mask = _case(np.random.default_rng(seed + 1))
    weights = mx.array(np.random.default_rng(seed + 2).normal(size=comp.shape).astype(np.float32)) * mask
    return model, prompts, completions, padded, left, comp, weights


def test_shared_prompt_gradients_match_plain(tiny_model_path):
    model, prompts, completions, padded, left, comp, weights = _lora_model_and_case(tiny_model_path, 0)

    def shared_loss(m):
        return (completion_logprobs(m, padded, left, comp, 3)[0] * weights).sum()

    def plain_loss(m):
        rows = _plain(m, prompts, completions, 3, 1.0)
        return sum((r * weights[i, : r.shape[0]]).sum() for i, r in enumerate(rows))

    _, g_shared = nn.value_and_grad(model, shared_loss)(model)
    _, g_plain = nn.value_and_grad(model, plain_loss)(model)
    a, b = dict(tree_flatten(g_shared)), dict(tree_flatten(g_plain))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(np.array(a[name]), np.array(b[name]), atol=5e-5, err_msg=name)
    assert max(np.abs(np.array(v)).max() for v in a.values()) > 1e-3


def test_chunked_projection_trains_a_trainable_head(tiny_model_path):
    """Full fine-tuning: the tied embedding's gradient through the chunks equals the unchunked one."""
    model, _ = load_policy(str(tiny_model_path))
    prepare_for_training(model, "full")
    _, _, padded, left, comp, mask = _case(np.random.default_rng(5))
    weights = mx.array(np.random.default_rng(6).normal(size=comp.shape).astype(np.float32)) * mask
    grads = {}
    for chunk in (None, 2):

        def loss(m):
            return (completion_logprobs(m, padded, left, comp, 3, chunk_size=chunk)[0] * weights).sum()

        grads[chunk] = dict(tree_flatten(nn.value_and_grad(model, loss)(model)[1]))
    embed = "model.embed_tokens.weight"
    assert np.abs(np.array(grads[2][embed])).max() > 1e-4
    np.testing.assert_allclose(np.array(grads[2][embed]), np.array(grads[None][embed]), atol=2e-5)


def test_shared_prompt_matches_plain_forward_with_a_sliding_window():
    """Gemma 3: sequences longer than the window; the shared-prompt mask must cut what the plain pass cuts."""
    from mlx_lm.models import gemma3_text

    mx.random.seed(3)
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=32,
        num_hidden_layers=4,
        intermediate_size=64,
        num_attention_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=256,
        num_key_value_heads=1,
        sliding_window=4,
        sliding_window_pattern=2,
    )
    model = gemma3_text.Model(args)
    model.sanitize({})  # no lm_head: the head is the tied embedding, as in the real checkpoints
    model.update(nn.utils.tree_map(lambda p: mx.random.normal(p.shape) * 0.5, model.parameters()))
    model.eval()
    prompts, completions, padded, left, comp, mask = _case(np.random.default_rng(4))
    assert max(len(prompts[i // 3]) + len(c) for i, c in enumerate(completions)) > 2 * args.sliding_window
    plain = _plain(model, prompts, completions, 3, 0.8)
    for chunk in (None, 2):
        shared, _ = completion_logprobs(model, padded, left, comp, 3, temperature=0.8, chunk_size=chunk)
        for i, row in enumerate(plain):
            np.testing.assert_allclose(np.array(shared[i, : len(completions[i])]), np.array(row), atol=2e-5)


def test_frozen_head_gradient_worked_out_in_the_forward_matches_autodiff(tiny_model_path, monkeypatch):
    """LoRA (frozen tied head): `differentiated` works d logp / d h out in the forward pass. Same values,
    same gradients (to the adapters and to the hidden states) as differentiating through the softmax."""
    from mlx_grpo.models.heads import output_head
    from mlx_grpo.update import logprobs
    from mlx_grpo.update.logprobs import _project

    calls = []
    original = logprobs._through_frozen_head
    monkeypatch.setattr(logprobs, "_through_frozen_head", lambda *a: calls.append(1) or original(*a))

    model, _, _, padded, left, comp, weights = _lora_model_and_case(tiny_model_path, 7)
    for chunk in (None, 2):
        values, grads = {}, {}
        for differentiated in (False, True):

            def loss(m):
                logp, entropy = completion_logprobs(
                    m, padded, left, comp, 3, temperature=0.7, chunk_size=chunk, differentiated=differentiated
                )
                values[differentiated] = (np.array(logp), np.array(entropy))
                return (logp * weights).sum()

            grads[differentiated] = dict(tree_flatten(nn.value_and_grad(model, loss)(model)[1]))
        for a, b in zip(values[True], values[False]):
            np.testing.assert_allclose(a, b, atol=1e-6)
        assert grads[True].keys() == grads[False].keys()
        for name in grads[True]:
            np.testing.assert_allclose(
                np.array(grads[True][name]), np.array(grads[False][name]), rtol=2e-5, atol=2e-6, err_msg=name
            )
        assert max(np.abs(np.array(v)).max() for v in grads[True].values()) > 1e-3
    assert len(calls) == 2  # the differentiated passes took the frozen-head path; the others did not

    # Against central differences in float64, on the hidden states alone.
    head = output_head(model)
    rng = np.random.default_rng(10)
    hidden = rng.normal(size=(2, 3, model.args.hidden_size)).astype(np.float32)
    targets = mx.array(rng.integers(0, model.args.vocab_size, size=(2, 3)))
    a = rng.normal(size=(2, 3))
    table = np.array(model.model.embed_tokens.weight).astype(np.float64)

    def numpy_objective(h):
        return (a * _numpy_logprobs_and_entropy(h @ table.T, np.array(targets), 0.7)[0]).sum()

    numeric = np.zeros(hidden.shape)
    for i in np.ndindex(hidden.shape):
        step = np.zeros(hidden.shape)
        step[i] = 1e-5
        numeric[i] = (numpy_objective(hidden + step) - numpy_objective(hidden - step)) / 2e-5
    got = mx.grad(
        lambda h: (
            mx.array(a, dtype=mx.float32) * _project(head, h, targets, 0.7, None, differentiated=True)[0]
        ).sum()
    )(mx.array(hidden))
    np.testing.assert_allclose(np.array(got), numeric, atol=1e-4)
    assert len(calls) == 3
