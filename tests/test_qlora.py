"""Quantized bases (QLoRA): adapters train on a frozen 4-bit model, or on its float32 copy on the CPU.

The tests of the float32 copy take the `cpu_device` fixture: a GPU backend keeps the 4-bit weights on
purpose."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load as mlx_lm_load

from mlx_grpo.api import Trainer
from mlx_grpo.config import ConfigError, build_config
from mlx_grpo.models import quantized
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.trainer import train
from tiny import build_tiny_quantized_model

TOKENS = mx.array([[1, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]])


@pytest.fixture(scope="module")
def quantized_model_path(tmp_path_factory):
    return build_tiny_quantized_model(tmp_path_factory.mktemp("q4") / "tiny-q4", bits=4)


def _quantized_weights(model) -> dict:
    return {
        k: np.array(v)
        for k, v in tree_flatten(model.parameters())
        if k.rsplit(".", 1)[0] in dict(quantized.quantized_modules(model))
    }


def _trainer(path, **settings):
    return Trainer(
        model=str(path),
        task="arith",
        batch_size=1,
        group_size=4,
        max_tokens=6,
        lr=1e-2,
        warmup_steps=0,
        eval_num_problems=2,
        **settings,
    )


def _update(trainer) -> dict:
    """One optimizer step with rewards that differ inside the group (the random model never scores)."""
    row = trainer.task.train_rows[0]
    group = trainer.sample(row["prompt"])
    return trainer.update([row], group, np.arange(len(group), dtype=float))


def test_quantized_base_trains_only_its_adapters(quantized_model_path):
    trainer = _trainer(quantized_model_path, keep_quantized=True)
    before = _quantized_weights(trainer.model)
    assert len(before) > 0 and all(b.dtype == np.uint32 for k, b in before.items() if k.endswith(".weight"))
    trainable = [k for k, _ in tree_flatten(trainer.model.trainable_parameters())]
    assert trainable and all(k.endswith((".lora_a", ".lora_b")) for k in trainable)
    lora_before = {k: np.array(v) for k, v in tree_flatten(trainer.model.trainable_parameters())}
    for _ in range(2):
        assert _update(trainer)["grad_norm"] > 0
    after = _quantized_weights(trainer.model)
    assert after.keys() == before.keys()
    for k in before:  # bit for bit: the base never moved
        assert after[k].tobytes() == before[k].tobytes(), k
    moved = [
        k
        for k, v in tree_flatten(trainer.model.trainable_parameters())
        if not np.array_equal(np.array(v), lora_before[k])
    ]
    assert moved  # ... while the adapters did


def test_mlx_lm_applies_the_saved_adapters_to_the_quantized_model(quantized_model_path, tmp_path):
    trainer = _trainer(quantized_model_path, keep_quantized=True)
    _update(trainer)
    trainer.model.eval()
    ours = trainer.model(TOKENS)
    folder = trainer.save(tmp_path / "adapters")
    theirs_model, _ = mlx_lm_load(str(quantized_model_path), adapter_path=str(folder))
    theirs = theirs_model(TOKENS)
    assert quantized.quantized_modules(theirs_model)  # mlx-lm kept it quantized, as a user's would be
    np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=0, atol=1e-5)


def test_the_cpu_copy_holds_the_dequantized_weights(quantized_model_path, cpu_device):
    kept, _ = load_policy(str(quantized_model_path), keep_quantized=True)
    copy, _ = load_policy(str(quantized_model_path))  # the CPU default: a float32 copy
    assert not quantized.quantized_modules(copy)
    layers = dict(quantized.quantized_modules(kept))
    float_layers = dict(copy.named_modules())
    for name, q in layers.items():
        expected = mx.dequantize(q.weight, q.scales, q.biases, q.group_size, q.bits).astype(mx.float32)
        assert float_layers[name].weight.dtype == mx.float32
        assert np.array_equal(np.array(float_layers[name].weight), np.array(expected)), name
    np.testing.assert_allclose(np.array(copy(TOKENS)), np.array(kept(TOKENS)), atol=1e-4)


def test_float32_size_is_counted_from_the_shapes(quantized_model_path, cpu_device):
    model, _ = load_policy(str(quantized_model_path), keep_quantized=True)
    float_model, _ = load_policy(str(quantized_model_path))  # the float32 copy (on a GPU it would stay 4-bit)
    expected = sum(v.size * 4 for _, v in tree_flatten(float_model.parameters()))
    assert quantized.float32_bytes(model) == expected
    assert quantized.describe_bits(model) == "4-bit"


def test_the_choice_is_stated_and_memory_bounds_it(quantized_model_path, cpu_device):
    model, _ = load_policy(str(quantized_model_path), keep_quantized=True)
    needed = quantized.float32_bytes(model)
    note = quantized.prepare_base(model, memory=needed)  # the copy would take all of it: too much
    assert "kept quantized" in note and quantized.quantized_modules(model)
    note = quantized.prepare_base(model, keep_quantized=True)
    assert "--keep-quantized" in note and quantized.quantized_modules(model)
    note = quantized.prepare_base(model, memory=4 * needed)
    assert "float32 copy" in note and not quantized.quantized_modules(model)
    assert quantized.prepare_base(model) is None  # nothing quantized left to decide about


def test_training_states_the_choice_and_full_fine_tuning_needs_float_weights(
    quantized_model_path, tmp_path, cpu_device
):
    events = []
    base = {
        "model": str(quantized_model_path),
        "task": "arith",
        "steps": 1,
        "batch_size": 2,
        "group_size": 2,
        "max_tokens": 4,
        "eval_num_problems": 2,
    }
    train(
        build_config({**base, "output": str(tmp_path / "run")}), on_event=lambda k, d: events.append((k, d))
    )
    notes = next(d["notes"] for k, d in events if k == "start")
    assert len(notes) == 1 and "4-bit" in notes[0] and "float32 copy" in notes[0]
    with pytest.raises(ConfigError, match="full"):
        train(
            build_config(
                {**base, "fine_tune_type": "full", "keep_quantized": True, "output": str(tmp_path / "full")}
            )
        )


def test_unquantized_models_are_left_alone(tiny_model_path):
    model, _ = load_policy(str(tiny_model_path), keep_quantized=True)
    assert quantized.prepare_base(model) is None
    assert all(type(m) is not nn.QuantizedLinear for _, m in model.named_modules())
