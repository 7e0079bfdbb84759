"""Layers recomputed in the backward pass: the same loss and gradients, less memory kept.

The decision (a pass's estimated activations against the memory budget) and its effect are both
checked: under a budget of a few bytes every pass recomputes, and the GRPO update's pieces (which
differentiate through the prompt's keys and values), its whole micro-batches, and sft's passes give
what they give with nothing recomputed, compiled or traced."""

import warnings

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.models import memory
from mlx_grpo.update import gradients, recompute
from mlx_grpo.update.batch import batch_shape, build_batch, micro_batches
from mlx_grpo.update.sft_loss import sft_gradients
from test_micro_batch_padding import _completions, _loss_and_gradients
from tiny import build_tiny_model


def _lora_model(path):
    model, _ = load_policy(str(path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4, "scale": 20.0, "num_layers": -1})
    model.update(tree_map(lambda w: w + 0.01, model.trainable_parameters()))  # B = 0 would hide gradients
    model.train()
    return model


def _budget(monkeypatch, gigabytes: str):
    monkeypatch.setenv(memory.ENV, gigabytes)


def _checkpoints(monkeypatch) -> list:
    """Counts the layers run under mx.checkpoint."""
    calls, real = [], mx.checkpoint

    def counting(fn):
        calls.append(fn)
        return real(fn)

    monkeypatch.setattr(recompute.mx, "checkpoint", counting)
    return calls


def test_the_decision_compares_a_pass_with_the_budget(tiny_model_path):
    """The tiny model: 2 layers, hidden 32, MLP 64, 4 heads. A row of 10 positions keeps 4 bytes x 2
    layers x ((4 x 64 + 12 x 32) x 10 + 2 x 4 heads x 10 x 10) = 57,600 bytes; after a prompt of 5,
    the scores are 10 x 15: 60,800."""
    model, _ = load_policy(str(tiny_model_path))
    assert recompute.kept_activation_bytes(model, 1, 10) == 57_600
    assert recompute.kept_activation_bytes(model, 3, 10) == 3 * 57_600
    assert recompute.kept_activation_bytes(model, 1, 10, context=15) == 60_800
    assert not recompute.needs_recompute(model, 2, 10, budget=2 * 57_600)
    assert recompute.needs_recompute(model, 2, 11, budget=2 * 57_600)
    assert recompute.needs_recompute(model, 2, 10, context=15, budget=2 * 57_600)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("piece_size", [2, 6])  # pieces through a shared prompt; whole groups
def test_recomputed_update_gives_the_same_loss_and_gradients(
    tiny_model_path, cpu_device, monkeypatch, compiled, piece_size
):
    monkeypatch.setattr(gradients, "COMPILE_ON_CPU", compiled)
    lengths = [5, 1, 4, 2, 6, 3, 2, 7, 1, 3, 5, 4]
    batch = build_batch(_completions(lengths, 6), np.random.default_rng(1).normal(size=12), 6)
    parts, sizes = micro_batches(batch, piece_size, by_length=True), batch_shape(batch, piece_size, 8, True)
    model = _lora_model(tiny_model_path)
    _budget(monkeypatch, "1000")
    calls = _checkpoints(monkeypatch)
    kept_loss, kept = _loss_and_gradients(model, parts, sizes, "dr_grpo")
    assert calls == []
    _budget(monkeypatch, "1e-9")  # one byte: every completion pass recomputes
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # compiled, it must not fall back to the traced path
        loss, grads = _loss_and_gradients(model, parts, sizes, "dr_grpo")
    assert len(calls) >= len(model.layers) * len(parts)
    assert abs(kept_loss) > 1e-4 and loss == pytest.approx(kept_loss, rel=1e-6, abs=1e-7)
    for name, g in kept.items():
        assert np.abs(g).max() > 0, name
        np.testing.assert_allclose(grads[name], g, rtol=1e-5, atol=1e-7, err_msg=name)
    # The layers' own __call__ is back afterwards: sampling never sees the checkpoint.
    calls.clear()
    model(mx.array([[3, 4, 5]]))
    assert calls == []


def test_recomputed_sft_gives_the_same_loss_and_gradients(tiny_model_path, cpu_device, monkeypatch):
    model = _lora_model(tiny_model_path)
    rng = np.random.default_rng(3)
    tokens = mx.array(rng.integers(3, 200, size=(3, 11)))
    trained = mx.array((rng.random((3, 11)) > 0.3).astype(np.float32))
    count = int(np.array(trained)[:, 1:].sum())
    calls = _checkpoints(monkeypatch)
    _budget(monkeypatch, "1000")
    kept_loss, kept = sft_gradients(model, tokens, trained, count)
    _budget(monkeypatch, "1e-9")
    loss, grads = sft_gradients(model, tokens, trained, count)
    assert len(calls) == len(model.layers)
    assert loss.item() == pytest.approx(kept_loss.item(), rel=1e-6)
    kept = dict(tree_flatten(kept))
    for name, g in tree_flatten(grads):
        np.testing.assert_allclose(np.array(g), np.array(kept[name]), rtol=1e-5, atol=1e-7, err_msg=name)


def test_recomputing_keeps_less_memory(tmp_path, cpu_device, monkeypatch):
    """One row of 512 positions through 8 layers of width 128: MLX's peak over the pass falls when the
    layers recompute (each layer's intermediates exist one layer at a time)."""
    model = _lora_model(build_tiny_model(tmp_path, hidden=128, layers=8))
    tokens = mx.array(np.random.default_rng(0).integers(3, 200, size=(1, 512)))
    trained = mx.ones(tokens.shape)
    count = tokens.shape[1] - 1

    def peak(gigabytes):
        _budget(monkeypatch, gigabytes)
        sft_gradients(model, tokens, trained, count)  # the first pass of a shape builds its kernels
        mx.clear_cache()
        mx.reset_peak_memory()
        sft_gradients(model, tokens, trained, count)
        return mx.get_peak_memory()

    kept, recomputed = peak("1000"), peak("1e-9")
    assert recomputed < 0.6 * kept, (kept, recomputed)
