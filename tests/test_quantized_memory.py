"""The float32 copy of a quantized base (models/quantized.py): the same values as one mx.dequantize of
each whole weight, made a layer and a piece at a time so that memory never holds twice the model, and
the input embedding kept quantized where it is only looked up and frozen.

A random qwen2 model with its own output head, its scales in float16 as a GGUF file's are, quantized
with the bit widths a Q4_K_M file mixes (5-bit embedding, 8-bit head, 4- and 5-bit layers): about
150 MB in float32, large enough that a whole-model transient stands out from one piece's."""

import gc

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import qwen2

from mlx_grpo.models import quantized
from mlx_grpo.models.adapters import prepare_for_training

SHAPE = {
    "model_type": "qwen2",
    "hidden_size": 512,
    "num_hidden_layers": 2,
    "intermediate_size": 1536,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": 32000,
    "rope_theta": 1e6,
}
PLENTY = 2**40  # bytes of memory said to be free: the copy always fits
TOKENS = mx.array([[1, 72, 101, 108, 31999, 111, 44, 32, 119]])


def _bits(path: str, module) -> dict | bool:
    if not hasattr(module, "to_quantized"):
        return False
    if path == "model.embed_tokens" or path.endswith("down_proj"):
        return {"group_size": 32, "bits": 5}
    return {"group_size": 32, "bits": 8 if path == "lm_head" else 4}


def _model(tied: bool = False) -> nn.Module:
    mx.random.seed(0)
    model = qwen2.Model(qwen2.ModelArgs.from_dict({**SHAPE, "tie_word_embeddings": tied}))
    model.set_dtype(mx.float16)  # scales and biases in float16, as GGUF's exact ones are
    nn.quantize(model, class_predicate=_bits)
    mx.eval(model.parameters())
    return model


def _nbytes(model) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def _originals(model) -> dict:
    return {
        name: (m.weight, m.scales, m.biases, m.group_size, m.bits)
        for name, m in quantized.quantized_modules(model)
    }


def _expected(original) -> mx.array:
    """One mx.dequantize of the whole weight, in float32 (what the copy was made of before it came in
    pieces)."""
    weight, scales, biases, group_size, bits = original
    return mx.dequantize(weight, scales.astype(mx.float32), biases.astype(mx.float32), group_size, bits)


def test_the_copy_holds_each_whole_weight_dequantized_in_float32(cpu_device):
    model = _model()
    originals = _originals(model)
    others = {k: v for k, v in tree_flatten(model.parameters()) if k.rsplit(".", 1)[0] not in originals}
    assert {m.bits for _, m in quantized.quantized_modules(model)} == {4, 5, 8}
    note = quantized.prepare_base(model, memory=PLENTY, fine_tune_type="full")
    assert "float32 copy" in note and not quantized.quantized_modules(model)
    layers = dict(model.named_modules())
    for name, original in originals.items():
        weight = layers[name].weight
        assert weight.dtype == mx.float32, name
        assert np.array_equal(np.array(weight), np.array(_expected(original))), name
    after = dict(tree_flatten(model.parameters()))
    for k, v in others.items():  # norms and biases: widened as they are
        assert after[k].dtype == mx.float32 and np.array_equal(
            np.array(after[k]), np.array(v.astype(mx.float32))
        )


def test_the_copy_never_holds_the_model_twice(cpu_device):
    model = _model()
    gc.collect()
    quantized_bytes = _nbytes(model)
    final = quantized.float32_bytes(model)
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    quantized.prepare_base(model, memory=PLENTY, fine_tune_type="full")
    peak = mx.get_peak_memory() - (before - quantized_bytes)  # what the model took at most
    assert _nbytes(model) == final  # the size the fit check counts is the copy's own
    # The copy, the quantized originals, and one piece's temporaries (a few pieces' worth of margin).
    # Made all at once (every layer's temporaries together), this model's copy peaked at 3.4 times its size.
    bound = final + quantized_bytes + 8 * quantized.PIECE_BYTES
    assert bound < 1.5 * final
    assert peak < bound, (peak, final, quantized_bytes)


def test_adapters_keep_the_lookup_only_embedding_quantized_with_identical_rows(cpu_device):
    widened = _model()
    quantized.prepare_base(widened, memory=PLENTY, fine_tune_type="full")
    model = _model()
    expected_bytes = quantized.float32_bytes(model, ("model.embed_tokens",))
    note = quantized.prepare_base(model, memory=PLENTY, fine_tune_type="lora")
    assert "input embedding kept 5-bit" in note
    assert [name for name, _ in quantized.quantized_modules(model)] == ["model.embed_tokens"]
    embedding = model.model.embed_tokens
    assert embedding.scales.dtype == mx.float32 and embedding.biases.dtype == mx.float32
    assert _nbytes(model) == expected_bytes
    assert _nbytes(widened) - expected_bytes > 0.75 * 4 * embedding.weight.shape[0] * SHAPE["hidden_size"]
    rows = embedding(TOKENS)
    assert rows.dtype == mx.float32
    assert np.array_equal(np.array(rows), np.array(widened.model.embed_tokens(TOKENS)))
    assert np.array_equal(np.array(model(TOKENS)), np.array(widened(TOKENS)))
    prepare_for_training(model, "lora")  # adapters train; the quantized embedding stays frozen
    trainable = [k for k, _ in tree_flatten(model.trainable_parameters())]
    assert trainable and all(k.endswith((".lora_a", ".lora_b")) for k in trainable)
    with pytest.raises(ValueError, match="full fine-tuning needs float weights"):
        prepare_for_training(model, "full")


def test_a_tied_embedding_is_the_head_and_is_widened(cpu_device):
    model = _model(tied=True)
    assert quantized.lookup_only_embedding(model) == ()
    note = quantized.prepare_base(model, memory=PLENTY)
    assert "input embedding" not in note and not quantized.quantized_modules(model)


def test_five_bit_weights_are_counted_at_their_true_size():
    floats = qwen2.Model(qwen2.ModelArgs.from_dict({**SHAPE, "tie_word_embeddings": False}))  # never computed
    assert quantized.float32_bytes(_model()) == sum(v.size * 4 for _, v in tree_flatten(floats.parameters()))
