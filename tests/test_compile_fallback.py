"""The compiled update's fallback to the traced one: the same values, said once with its reason."""

import warnings

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlx_grpo.update import gradients


def _value_and_grad(model, x):
    def loss_fn(model):
        return (model(x) ** 2).mean(), {"n": mx.array(float(x.shape[0]))}

    def fn():
        (loss, stats), grads = nn.value_and_grad(model, loss_fn)(model)
        return loss, stats, grads

    return fn


def test_a_failing_compile_falls_back_to_the_same_values_and_says_so_once(monkeypatch):
    mx.random.seed(0)
    model = nn.Linear(4, 3)
    x = mx.random.normal((5, 4))
    traced_loss, _, traced_grads = gradients._evaluated(model, _value_and_grad(model, x), compiled=False)

    def broken_compile(*args, **kwargs):
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(gradients.mx, "compile", broken_compile)
    monkeypatch.setattr(gradients, "_fallback_reported", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            loss, stats, grads = gradients._evaluated(model, _value_and_grad(model, x), compiled=True)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "RuntimeError: no kernel for this shape" in messages[0] and "traced" in messages[0]
    assert float(loss) == float(traced_loss) and float(stats["n"]) == 5.0
    np.testing.assert_array_equal(np.array(grads["weight"]), np.array(traced_grads["weight"]))
