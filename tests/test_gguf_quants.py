"""Every GGUF block type that llama.cpp's presets write, against the `gguf` package's NumPy dequantizers.

The oracle (gguf.quants.dequantize) is llama.cpp's own reference code ported
to NumPy, written independently of gguf_quants.py. Blocks are random bytes
with sane float16 super-scales, so every bit of every field is exercised.
"""

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.models.gguf import converted_folder, types_note
from mlx_grpo.models.gguf_arch import hf_name
from mlx_grpo.models.gguf_file import GGUFError, read_header
from mlx_grpo.models.gguf_quants import TYPES, decode, dequantize
from mlx_grpo.models.loading import load_policy

from gguf_files import build_hf_model, gguf_tensors, hf_model, numpy_weights, train_bpe, write_gguf

gguf = pytest.importorskip("gguf")

# Where each type keeps its float16 super-scales (byte offsets in a block).
SCALE_FIELDS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}
KEPT = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}
pytestmark = pytest.mark.usefixtures("gguf_cache")


def random_blocks(name: str, rows: int, row_length: int, seed: int = 0, scale: float = 0.01) -> np.ndarray:
    """(rows, bytes per row) of random blocks of type `name` whose super-scales are ordinary float16s."""
    _, block, size = next(t for t in TYPES.values() if t[0] == name)
    rng = np.random.default_rng(seed)
    n = rows * row_length // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for start in SCALE_FIELDS[name]:
        halfs = (rng.normal(size=n) * scale).astype(np.float16)
        raw[:, start : start + 2] = halfs.view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, -1)


def type_id(name: str) -> int:
    return next(i for i, t in TYPES.items() if t[0] == name)


@pytest.mark.parametrize("name", list(SCALE_FIELDS))
def test_blocks_decode_exactly_as_llama_cpp_does(name):
    raw = random_blocks(name, 6, 512, seed=len(name))
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).astype(np.float32)
    got = dequantize(raw.reshape(-1), type_id(name), (6, 512))
    np.testing.assert_array_equal(got, want)
    kind, value = decode(raw.reshape(-1), type_id(name), (6, 512))
    if name in KEPT:  # MLX's own dequantization of what is kept gives the same numbers
        packed, scales, biases, bits = value
        assert kind == "affine" and bits == KEPT[name] and packed.dtype == np.uint32
        mlx = mx.dequantize(
            mx.array(packed),
            mx.array(scales.astype(np.float32)),
            mx.array(biases.astype(np.float32)),
            group_size=32,
            bits=bits,
        )
        np.testing.assert_array_equal(np.array(mlx), want)
        # K scales are d * sc: float32 unless every one of them is exact in float16
        assert scales.dtype == (np.float32 if name.endswith("_K") else np.float16)
    else:  # widened: no group of 32 holds a 16-element sub-block
        assert kind == "float" and value.dtype == np.float32


def test_float_types_and_float16_when_exact():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 64)).astype(np.float32)
    bf16 = gguf.quants.quantize(w, gguf.GGMLQuantizationType.BF16)
    np.testing.assert_array_equal(
        dequantize(bf16.reshape(-1), type_id("BF16"), (3, 64)),
        gguf.quants.dequantize(bf16, gguf.GGMLQuantizationType.BF16),
    )
    # A Q6_K tensor whose values all happen to be float16 numbers is carried as float16, exactly.
    raw = random_blocks("Q6_K", 2, 256, scale=0.0)
    raw[:, 208:210] = np.array([1.0], np.float16).view(np.uint8)  # d = 1 and scales of 1-3: small integers
    raw[:, 192:208] = np.random.default_rng(1).integers(1, 4, size=(2, 16))
    kind, value = decode(raw.reshape(-1), type_id("Q6_K"), (2, 256))
    assert kind == "float" and value.dtype == np.float16
    np.testing.assert_array_equal(
        value.astype(np.float32), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q6_K)
    )


TOKENS = [[5, 17, 200, 33, 1, 90, 250, 7]]


def mixed_file(tmp_path):
    """A Q4_K_M-like mix: K types where rows hold 256, Q5_0/Q5_1/Q8_0/Q4_x elsewhere, F32 norms, a Q5_0
    embedding that is also the (tied) output head. Returns the file, the float weights it stores (HF
    names), the model's config and its tokenizer."""
    bpe = train_bpe()
    config = build_hf_model(tmp_path / "hf", "qwen2", len(bpe["tokens"]), intermediate=256, layers=5)
    weights = numpy_weights(tmp_path / "hf")
    names = gguf_tensors(weights, config)
    k_types = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
    chosen = {f"blk.{i}.ffn_down.weight": t for i, t in enumerate(k_types)}  # rows of 256
    chosen.update(
        {
            "blk.0.attn_q.weight": "Q5_0",
            "blk.1.attn_k.weight": "Q5_1",
            "blk.2.attn_v.weight": "Q8_0",
            "blk.3.ffn_up.weight": "Q4_1",
            "blk.4.ffn_gate.weight": "Q4_0",
            "token_embd.weight": "Q5_0",
        }
    )
    blocks, stored = {}, dict(weights)
    for i, (name, kind) in enumerate(chosen.items()):
        raw = random_blocks(kind, *names[name].shape, seed=i, scale=0.004)
        blocks[name] = (kind, raw)
        stored[hf_name(name, "qwen2")] = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    return write_gguf(tmp_path / "mix.gguf", config, weights, bpe, blocks=blocks), stored, config, bpe


def test_a_mixed_k_quant_file_loads_as_its_dequantized_model(tmp_path, cpu_device):
    path, stored, config, _ = mixed_file(tmp_path)
    want = hf_model(stored, config)
    folder = converted_folder(path)
    note = types_note(folder)
    assert "Q4_K x1: kept 4-bit (exact)" in note and "Q5_K x1: kept 5-bit (exact)" in note
    assert "Q6_K x1: float32 (exact)" in note and "Q2_K x1: float32 (exact)" in note and "Q5_0 x2" in note
    model, _ = load_policy(str(path))  # on the CPU: the float32 copy of the kept layers
    tokens = mx.array(TOKENS)
    expected = np.array(want(tokens))
    np.testing.assert_allclose(np.array(model(tokens)), expected, atol=2e-5)
    kept, _ = load_policy(str(path), keep_quantized=True)  # MLX's quantized kernels on the kept layers
    assert kept.model.layers[2].mlp.down_proj.bits == 4 and kept.model.layers[3].mlp.down_proj.bits == 5
    assert kept.model.embed_tokens.bits == 5 and kept.model.layers[2].self_attn.v_proj.bits == 8
    # Tied head through the quantized embedding. Its looked-up rows come out in float16 (the dtype of
    # its exact float16 scales), as in any mlx-lm quantized model; these random weights amplify that
    # rounding to about 1% (measured: 0.95%, and 2e-6 with the scales cast to float32).
    got = np.array(kept(tokens).astype(mx.float32))
    assert np.abs(got - expected).max() < 2e-2 * np.abs(expected).max()
    assert (got.argmax(-1) == expected.argmax(-1)).all()


def test_llama_cpp_runs_the_mixed_file_as_we_do(tmp_path):
    """llama.cpp decodes the same blocks itself. In quantized matmuls it rounds activations to 8 bits,
    which moves its logits 1-4% per K type on these random weights (7% for the mix, measured against
    its run of an F32 file of the same values), so: as close to that F32 run as float rounding allows,
    and no further from its run of the mixed file than llama.cpp itself is."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path, stored, config, bpe = mixed_file(tmp_path)
    floats = write_gguf(tmp_path / "f32.gguf", config, stored, bpe)

    def llama_cpp_logits(file):
        reference = llama_cpp.Llama(str(file), logits_all=True, n_ctx=64, n_threads=1, verbose=False)
        reference.eval(TOKENS[0])
        return np.array(reference.scores[: len(TOKENS[0])])

    quantized, exact = llama_cpp_logits(path), llama_cpp_logits(floats)
    got = np.array(load_policy(str(path))[0](mx.array(TOKENS)))[0]
    scale = np.abs(exact).max()
    assert np.abs(got - exact).max() < 5e-3 * scale  # measured 0.13% (float16 KV cache)
    assert np.abs(got - quantized).max() < np.abs(exact - quantized).max() + 5e-3 * scale


@pytest.mark.parametrize("damage", ["iq", "row", "truncated"])
def test_broken_tensors_are_one_line_and_nothing_is_cached(tmp_path, damage):
    bpe = train_bpe()
    config = build_hf_model(tmp_path / "hf", "qwen2", len(bpe["tokens"]), intermediate=256)
    weights = numpy_weights(tmp_path / "hf")
    if damage == "iq":
        path = write_gguf(tmp_path / "x.gguf", config, weights, bpe, raw={"blk.0.ffn_down.weight": "IQ2_XS"})
        message = "type IQ2_XS, which mlx-grpo does not read"
    elif damage == "row":  # a header that calls an F32 tensor with rows of 64 a Q4_K one (blocks of 256)
        path = write_gguf(tmp_path / "x.gguf", config, weights, bpe)
        data = bytearray(path.read_bytes())
        name = b"blk.0.attn_q.weight"
        at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
        dims = int.from_bytes(data[at : at + 4], "little")
        type_at = at + 4 + 8 * dims
        assert int.from_bytes(data[type_at : type_at + 4], "little") == 0  # F32
        data[type_at : type_at + 4] = (12).to_bytes(4, "little")
        path.write_bytes(bytes(data))
        message = "rows of 64 values, not whole Q4_K blocks of 256"
    else:  # the file ends inside the first Q6_K block of a tensor (an incomplete download)
        name = "blk.1.ffn_down.weight"
        shape = gguf_tensors(weights, config)[name].shape
        path = write_gguf(
            tmp_path / "x.gguf",
            config,
            weights,
            bpe,
            tensor_type="Q8_0",
            blocks={name: ("Q6_K", random_blocks("Q6_K", *shape))},
        )
        start = next(t.offset for t in read_header(path).tensors if t.name == name)
        path.write_bytes(path.read_bytes()[: start + 100])
        message = f"tensor {name} ends past the end of the file .* truncated"
    with pytest.raises(GGUFError, match=message) as error:
        converted_folder(path)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())
