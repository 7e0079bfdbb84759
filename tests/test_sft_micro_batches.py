"""sft's step on a CPU cuts a batch into micro-batches by train's activation budget, and the step it takes
is the same as in one pass: the loss is normalised by the whole batch's trained tokens, so the gradients
add up exactly."""

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run import sft
from mlx_grpo.update import batch as batch_module


def _lora_model(path):
    mx.random.seed(0)  # the same LoRA initialisation for both steps
    model, _ = load_policy(str(path))
    prepare_for_training(model, "lora", {"rank": 4, "scale": 20.0, "dropout": 0.0, "num_layers": -1})
    model.update(tree_map(lambda w: w + 0.01, model.trainable_parameters()))  # B = 0 would hide gradients
    model.train()
    return model


def _examples():
    rng = np.random.default_rng(5)
    rows = []
    for length in (13, 11, 9, 7):
        ids = rng.integers(3, 200, size=length).tolist()
        rows.append((ids, [0.0] * 3 + [1.0] * (length - 3)))
    return rows


def _step(path, monkeypatch, budget):
    monkeypatch.setattr(batch_module, "CPU_ACTIVATION_BUDGET", budget)
    model = _lora_model(path)
    passes = []
    real = sft.sft_gradients
    monkeypatch.setattr(
        sft, "sft_gradients", lambda m, tokens, *a: passes.append(tokens.shape) or real(m, tokens, *a)
    )
    metrics = sft.sft_step(model, optim.SGD(learning_rate=1.0), _examples(), 0, 8, max_grad_norm=100.0)
    return metrics, passes, dict(tree_flatten(model.trainable_parameters()))


def test_rows_past_the_budget_go_one_a_pass_and_take_the_same_step(tiny_model_path, cpu_device, monkeypatch):
    per_position = batch_module.activation_bytes_per_position(_lora_model(tiny_model_path))
    whole, whole_passes, whole_weights = _step(tiny_model_path, monkeypatch, 10 * per_position * 12)
    assert whole_passes == [(4, 13)]  # 12 scored positions a row: all four rows fit in one pass
    cut, cut_passes, cut_weights = _step(tiny_model_path, monkeypatch, per_position * 12)
    assert cut_passes == [(1, 13), (1, 11), (1, 9), (1, 7)]  # one row a pass, each padded to itself only
    assert abs(cut["loss"] - whole["loss"]) < 1e-5
    assert abs(cut["grad_norm"] - whole["grad_norm"]) < 1e-5 * whole["grad_norm"]
    assert cut["trained_tokens"] == whole["trained_tokens"] == 10 + 8 + 6 + 4
    start = dict(tree_flatten(_lora_model(tiny_model_path).trainable_parameters()))
    for name, w in whole_weights.items():  # plain SGD at lr 1: each weight moved by minus its gradient
        whole_step, cut_step = np.array(w - start[name]), np.array(cut_weights[name] - start[name])
        assert np.abs(whole_step).max() > 0, name
        np.testing.assert_allclose(
            cut_step, whole_step, rtol=1e-4, atol=1e-5 * np.abs(whole_step).max(), err_msg=name
        )
