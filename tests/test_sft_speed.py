"""How sft's step runs on a CPU: its value and gradient compiled whole, as the GRPO update's are."""

import warnings

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.update import gradients
from mlx_grpo.update.sft_loss import sft_gradients


def _lora_model(path, dropout=0.0):
    model, _ = load_policy(str(path))
    prepare_for_training(model, "lora", {"rank": 4, "scale": 20.0, "dropout": dropout, "num_layers": -1})
    model.update(tree_map(lambda w: w + 0.01, model.trainable_parameters()))  # B = 0 would hide gradients
    model.train()
    return model


def _batch():
    rng = np.random.default_rng(3)
    tokens = mx.array(rng.integers(3, 200, size=(3, 11)))
    trained = mx.array((rng.random((3, 11)) > 0.3).astype(np.float32))
    return tokens, trained, int(np.array(trained)[:, 1:].sum())


def _counting_compile(monkeypatch):
    calls, real = [], mx.compile

    def counting(fn, **kwargs):
        calls.append(fn)
        return real(fn, **kwargs)

    monkeypatch.setattr(mx, "compile", counting)
    return calls


def test_sft_gradients_are_compiled_on_a_cpu_and_equal_the_traced_ones(
    tiny_model_path, cpu_device, monkeypatch
):
    model = _lora_model(tiny_model_path)
    tokens, trained, count = _batch()
    monkeypatch.setattr(gradients, "COMPILE_ON_CPU", False)
    traced_loss, traced = sft_gradients(model, tokens, trained, count)
    monkeypatch.setattr(gradients, "COMPILE_ON_CPU", True)
    calls = _counting_compile(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the traced path
        loss, grads = sft_gradients(model, tokens, trained, count)
    assert len(calls) == 1
    assert loss.item() == pytest.approx(traced_loss.item(), rel=1e-6)
    traced = dict(tree_flatten(traced))
    assert len(traced) == 2 * 2 * 7  # lora_a and lora_b of 7 linears in 2 layers
    for name, g in tree_flatten(grads):
        np.testing.assert_allclose(np.array(g), np.array(traced[name]), rtol=1e-5, atol=1e-7, err_msg=name)


def test_with_dropout_sft_gradients_run_traced(tiny_model_path, cpu_device, monkeypatch):
    """A compiled trace would hold one dropout mask as a constant."""
    model = _lora_model(tiny_model_path, dropout=0.1)
    tokens, trained, count = _batch()
    calls = _counting_compile(monkeypatch)
    sft_gradients(model, tokens, trained, count)
    assert calls == []


def test_the_head_is_chunked_once_a_micro_batch_logits_pass_trains_threshold(tiny_model_path, monkeypatch):
    """logprob_chunk_size None is automatic in sft as in train: 128 positions a chunk above the threshold."""
    from mlx_grpo.run import sft, step_update

    model = _lora_model(tiny_model_path)
    tokens, _, _ = _batch()
    logits = 3 * 10 * model.model.embed_tokens.weight.shape[0]  # 3 rows, 10 scored positions each
    assert sft.head_chunk(model, tokens, None) is None and sft.head_chunk(model, tokens, 4) == 4
    monkeypatch.setattr(step_update, "_CHUNK_LOGITS_ABOVE", logits)
    assert sft.head_chunk(model, tokens, None) is None
    monkeypatch.setattr(step_update, "_CHUNK_LOGITS_ABOVE", logits - 1)
    assert sft.head_chunk(model, tokens, None) == 128

    chunks = []
    for name in ("sft_gradients", "sft_loss"):  # the step's and the validation loss's
        real = getattr(sft, name)
        monkeypatch.setattr(sft, name, lambda *a, _real=real, **kw: chunks.append(a[4]) or _real(*a, **kw))
    examples = [(list(row), [0.0] * 4 + [1.0] * 7) for row in np.array(tokens).tolist()]
    sft.sft_step(
        model,
        optimizer=optim.AdamW(learning_rate=1e-3),
        examples=examples,
        pad_id=0,
        micro_batch_size=8,
        max_grad_norm=1.0,
    )
    sft.validation_loss(model, examples, 0, 8)
    assert chunks == [128, 128]


def test_only_the_trained_positions_go_through_the_output_head(tiny_model_path, monkeypatch):
    from mlx_grpo.update import sft_loss as module

    model = _lora_model(tiny_model_path)
    tokens, trained, count = _batch()
    rows = []
    real = module._project
    monkeypatch.setattr(
        module,
        "_project",
        lambda head, hidden, *a, **kw: rows.append(hidden.shape[1]) or real(head, hidden, *a, **kw),
    )
    module.sft_loss(model, tokens, trained, count, differentiated=False)
    # 3 rows x 10 scored positions, of which `count` are trained: the head scores those alone.
    assert rows == [count] and count < 30
