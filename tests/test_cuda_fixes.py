"""The CUDA RoPE workaround: rotating in row chunks computes what one launch computes, only
small heads get it, and a wide decode of a head-dim-16 model (the shape that failed to launch on
CUDA) samples what narrow waves sample. Run on a GPU machine (scripts/gpu_check.sh), the last test
is the regression test of the crash; on the CPU it checks the same equalities."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models import qwen2

from mlx_grpo.models.cuda_fixes import RowChunkedRoPE, rows_per_launch, wrap_small_ropes
from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling import fixed_decode
from mlx_grpo.sampling.rollout import SamplingConfig, sample_completions
from mlx_grpo.tasks.data import encode_prompt


def numpy_rope(x, positions, dims, base):
    """Non-traditional RoPE: the two halves of the first `dims` features rotate by position x
    base^(-2i/dims)."""
    half = dims // 2
    angles = positions[:, None, None, None] * base ** (-np.arange(half) * 2.0 / dims)
    x1, x2 = x[..., :half], x[..., half:dims]
    return np.concatenate(
        [x1 * np.cos(angles) - x2 * np.sin(angles), x1 * np.sin(angles) + x2 * np.cos(angles), x[..., dims:]],
        axis=-1,
    )


@pytest.mark.parametrize("heads", [1, 4, 14])
def test_row_chunked_rope_matches_numpy_for_one_position(heads):
    rng = np.random.default_rng(heads)
    rows = 300  # several chunks, the last one partial
    x = rng.normal(size=(rows, heads, 1, 16)).astype(np.float32)
    positions = rng.integers(0, 500, rows)
    rope = RowChunkedRoPE(nn.RoPE(16, base=10000.0))
    tolerance = 1e-4  # MLX forms float32 angles: position 500 x frequency 1 rounds by ~3e-5
    assert rows_per_launch(mx.array(x)) * -(-heads // 4) < 128 < rows
    per_row = rope(mx.array(x), offset=mx.array(positions, dtype=mx.int32))
    np.testing.assert_allclose(
        np.array(per_row), numpy_rope(x, positions.astype(np.float64), 16, 10000.0), atol=tolerance
    )
    shared = rope(mx.array(x), offset=37)
    np.testing.assert_allclose(
        np.array(shared), numpy_rope(x, np.full(rows, 37.0), 16, 10000.0), atol=tolerance
    )


def _qwen2(hidden, heads):
    return qwen2.Model(
        qwen2.ModelArgs.from_dict(
            {
                "model_type": "qwen2",
                "hidden_size": hidden,
                "num_hidden_layers": 3,
                "intermediate_size": 2 * hidden,
                "num_attention_heads": heads,
                "num_key_value_heads": 2,
                "rms_norm_eps": 1e-6,
                "vocab_size": 64,
                "tie_word_embeddings": True,
            }
        )
    )


def test_only_ropes_of_fewer_than_32_dimensions_are_wrapped():
    small = _qwen2(hidden=64, heads=4)  # head dim 16
    params = small.parameters()
    assert wrap_small_ropes(small) == 3
    assert all(isinstance(layer.self_attn.rope, RowChunkedRoPE) for layer in small.layers)
    assert wrap_small_ropes(small) == 0  # already wrapped: nothing happens twice
    assert small.parameters().keys() == params.keys()  # checkpoints and adapters see the same tree
    assert wrap_small_ropes(_qwen2(hidden=256, heads=4)) == 0  # head dim 64


@pytest.mark.parametrize("decoder", ["fixed", "generator"])
def test_a_wide_decode_of_a_head_dim_16_model_samples_what_narrow_waves_sample(decoder, monkeypatch):
    model, tokenizer = load_policy()  # the embedded model: head dim 16
    wrap_small_ropes(
        model
    )  # as load_policy does on CUDA (there it finds them wrapped): tested on every backend
    assert all(layer.self_attn.rope.rope.dims == 16 for layer in model.layers)
    if decoder == "generator":
        monkeypatch.setattr(fixed_decode, "supports_fixed_decode", lambda model, length=None: False)
    prompts = [encode_prompt(tokenizer, f"what is {i} + {2 * i}?") for i in range(40)]
    sampling = SamplingConfig(temperature=1.0, max_tokens=6)
    wide = sample_completions(model, tokenizer, prompts, 4, sampling, concurrency=160, seed=11)
    narrow = sample_completions(model, tokenizer, prompts, 4, sampling, concurrency=32, seed=11)
    assert [c.tokens for c in wide] == [c.tokens for c in narrow]
    np.testing.assert_allclose(
        np.concatenate([c.logprobs for c in wide]), np.concatenate([c.logprobs for c in narrow]), atol=1e-4
    )
