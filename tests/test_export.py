"""`mlx-grpo export`: base + adapters fused and written as GGUF (f16, q8_0, q4_0) or as an MLX folder.

Every architecture that imports exports: llama, mistral (as llama), qwen2, qwen3, gemma3 and phi3.

The fused model must compute what the base with its adapters computed; the
GGUF file must read back (gguf's reader: names, shapes, types, metadata),
re-import to the same greedy completions, keep the adapters' update
unrounded by the base's quantization, and run in llama.cpp (when installed)
with the same greedy completion.
"""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load as mlx_lm_load

gguf = pytest.importorskip("gguf")

from gguf_files import (  # noqa: E402
    MODEL_TYPES,
    SAMPLE_TEXTS,
    build_hf_model,
    gguf_name,
    llama_cpp_order,
    numpy_weights,
    train_bpe,
    write_gguf,
    write_hf_tokenizer,
)

from mlx_grpo.models.export import ExportError, export, fuse_in_float32, load_fused  # noqa: E402
from mlx_grpo.models.gguf import GGUFError, converted_folder  # noqa: E402
from mlx_grpo.models.loading import load_policy  # noqa: E402
from mlx_grpo.models.adapters import prepare_for_training, save_adapters  # noqa: E402

PROMPT = [5, 17, 200, 33, 90, 250, 7, 64]
LORA = {"rank": 4, "scale": 2.0, "dropout": 0.0, "num_layers": -1}


# Converted GGUF folders go to a fresh cache per test (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("gguf_cache")


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(1000)


def make_adapters(base: str, folder, seed: int = 3, kind: str = "lora") -> str:
    """An adapter folder for `base` whose LoRA/DoRA update is far from zero (as after training)."""
    model, _ = load_policy(base, keep_quantized=True)
    adapter_config = prepare_for_training(model, kind, LORA)
    mx.random.seed(seed)
    for _, module in model.named_modules():
        if hasattr(module, "lora_b"):
            module.lora_b = mx.random.normal(module.lora_b.shape) * 0.05
    save_adapters(model, folder, {**adapter_config, "model": base})
    return str(folder)


def gguf_base(tmp_path, bpe, arch, tensor_type):
    config = build_hf_model(tmp_path / "hf", arch, len(bpe["tokens"]))
    return str(
        write_gguf(
            tmp_path / "base.gguf", config, numpy_weights(tmp_path / "hf"), bpe, tensor_type=tensor_type
        )
    )


def greedy(model, prompt=PROMPT, n=12):
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(mx.argmax(model(mx.array([tokens]))[0, -1])))
    return tokens[len(prompt) :]


def logits(model, tokens=PROMPT):
    return np.array(model(mx.array([tokens]))[0].astype(mx.float32))


def rounded(model, tensor_type):
    """A copy of the model's weights, 2-D ones through a GGUF quantization round trip in NumPy."""
    qtype = gguf.GGMLQuantizationType[tensor_type]
    params = [
        (
            k,
            mx.array(gguf.quants.dequantize(gguf.quants.quantize(np.array(v), qtype), qtype).reshape(v.shape))
            if v.ndim == 2
            else v,
        )
        for k, v in tree_flatten(model.parameters())
    ]
    copy = type(model)(model.args)
    if hasattr(copy, "sanitize"):  # gemma3 learns here that its embeddings are tied
        params = list(copy.sanitize(dict(params)).items())
    copy.load_weights(params)
    return copy


def relative_gap(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


@pytest.mark.parametrize(
    "arch,base_type,kind",
    [
        ("llama", "F32", "lora"),
        ("llama", "Q4_0", "lora"),
        ("qwen2", "F32", "lora"),
        ("qwen2", "Q4_0", "lora"),
        ("llama", "F32", "dora"),
        ("qwen2", "Q4_0", "dora"),
    ],
)
def test_fused_model_computes_what_base_plus_adapters_did(tmp_path, bpe, arch, base_type, kind):
    base = gguf_base(tmp_path, bpe, arch, base_type)
    adapters = make_adapters(base, tmp_path / "adapters", kind=kind)
    unfused, _ = load_policy(base, adapters, keep_quantized=True)
    fused, _, _, _ = load_fused(base, adapters)
    # The quantized reference computes its matmuls in float16 (its scales' type); the fused model in float32.
    assert relative_gap(logits(fused), logits(unfused)) < (1e-4 if base_type == "F32" else 2e-3)
    assert all(p.dtype == mx.float32 for _, p in tree_flatten(fused.parameters()))
    base_only, _ = load_policy(base, keep_quantized=True)
    assert relative_gap(logits(base_only), logits(unfused)) > 1e-2  # the adapters matter


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_export_reads_back_and_reimports(tmp_path, bpe, arch):
    base = gguf_base(tmp_path, bpe, arch, "Q8_0")
    adapters = make_adapters(base, tmp_path / "adapters")
    fused, _, config, _ = load_fused(base, adapters)
    expected = greedy(fused)
    for outtype in ("f16", "q8_0", "q4_0"):
        out = tmp_path / f"out-{outtype}.gguf"
        export(base, adapters, gguf_path=str(out), outtype=outtype)
        reader = gguf.GGUFReader(str(out))
        fields = {name: field.contents() for name, field in reader.fields.items()}
        assert fields["general.architecture"] == arch
        assert fields[f"{arch}.block_count"] == config["num_hidden_layers"]
        assert fields[f"{arch}.attention.head_count_kv"] == config["num_key_value_heads"]
        assert (
            fields["tokenizer.ggml.tokens"] == bpe["tokens"]
            and fields["tokenizer.ggml.merges"] == bpe["merges"]
        )
        assert fields["tokenizer.ggml.pre"] == "qwen2" and "im_start" in fields["tokenizer.chat_template"]
        tensors = {t.name: t for t in reader.tensors}
        assert "output.weight" not in tensors  # tied embeddings stay tied
        q = tensors["blk.0.attn_q.weight"]
        assert q.tensor_type.name == outtype.upper() and list(q.shape) == [config["hidden_size"]] * 2
        assert tensors["blk.0.attn_norm.weight"].tensor_type.name == "F32"
        reimported, _ = mlx_lm_load(str(converted_folder(out)))
        gap = relative_gap(logits(reimported), logits(fused))
        if outtype == "f16":
            assert gap < 2e-3 and greedy(reimported) == expected
        else:  # exactly the fused model through the gguf package's own quantizer (NumPy), and close to it
            assert relative_gap(logits(reimported), logits(rounded(fused, outtype.upper()))) < 2e-3
            assert gap < {"q8_0": 2e-2, "q4_0": 0.5}[outtype]
        if outtype == "q8_0":
            assert sum(a == b for a, b in zip(greedy(reimported), expected)) >= 8


def folder_base(tmp_path, bpe, arch, **extra):
    folder = tmp_path / "hf"
    build_hf_model(folder, arch, len(bpe["tokens"]), **extra)
    write_hf_tokenizer(folder, bpe)
    return str(folder)


# What each converter writes that the others do not (tests/gguf_files.py's tiny models).
ARCH_FIELDS = {
    "qwen3": {"qwen3.attention.key_length": 32, "qwen3.attention.value_length": 32},
    "gemma3_text": {
        "gemma3.attention.sliding_window": 4,
        "gemma3.attention.key_length": 32,
        "gemma3.block_count": 6,
    },
    "phi3": {"phi3.rope.dimension_count": 8, "phi3.rope.scaling.original_context_length": 512},
    "mistral": {"llama.rope.dimension_count": 16},
}


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text", "phi3", "mistral"])
def test_other_architectures_export_as_llama_cpp_writes_them(tmp_path, bpe, arch):
    """Names from llama.cpp's converter table, its metadata and stored conventions; the file re-imports to
    the fused model and llama.cpp (when installed) runs it to the same logits. Mistral from a folder model:
    no GGUF file is a mistral (llama.cpp's converter writes it as llama)."""
    base = folder_base(tmp_path, bpe, arch) if arch == "mistral" else gguf_base(tmp_path, bpe, arch, "F32")
    adapters = make_adapters(base, tmp_path / "adapters")
    fused, _, config, _ = load_fused(base, adapters)
    out = export(base, adapters, gguf_path=str(tmp_path / "out.gguf"))[0]
    reader = gguf.GGUFReader(str(out))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == MODEL_TYPES[arch][1]
    for key, value in ARCH_FIELDS[arch].items():
        assert fields[key] == value, key
    params = dict(tree_flatten(fused.parameters()))
    tensors = {
        t.name: np.array(t.data, dtype=np.float32).reshape(tuple(reversed(t.shape.tolist())))
        for t in reader.tensors
    }
    assert set(tensors) == {gguf_name(name, arch) for name in params}
    if arch == "gemma3_text":  # stored as llama.cpp's converter stores them: plus one
        for name in (
            "model.norm.weight",
            "model.layers.2.pre_feedforward_layernorm.weight",
            "model.layers.5.self_attn.q_norm.weight",
        ):
            np.testing.assert_allclose(tensors[gguf_name(name, arch)], np.array(params[name]) + 1, atol=1e-6)
    if arch == "mistral":  # a llama file: Q/K rows in llama.cpp's order
        q = np.array(params["model.layers.1.self_attn.q_proj.weight"])
        np.testing.assert_allclose(tensors["blk.1.attn_q.weight"], llama_cpp_order(q, 4), atol=2e-3)
    reimported, _ = mlx_lm_load(str(converted_folder(out)))
    # Run in float16 as loaded (gemma3's six layers gather 3e-3 of rounding); in float32, it is exactly
    # the fused model with its matrices rounded to float16.
    assert relative_gap(logits(reimported), logits(fused)) < 5e-3
    assert greedy(reimported, n=6) == greedy(fused, n=6)
    widened = fuse_in_float32(mlx_lm_load(str(converted_folder(out)))[0])
    assert relative_gap(logits(widened), logits(rounded(fused, "F16"))) < 1e-5
    try:
        import llama_cpp
    except ImportError:
        return
    runner = llama_cpp.Llama(str(out), n_ctx=64, n_threads=1, logits_all=True, verbose=False)
    runner.eval(PROMPT)
    assert relative_gap(logits(reimported), np.array(runner.scores[: len(PROMPT)])) < 5e-3


def test_what_gguf_cannot_carry_is_one_line_and_writes_nothing(tmp_path, bpe):
    """An architecture llama.cpp's GGUF has no place for in our tables, or a gemma3 whose settings
    llama.cpp would not take from the file, is refused before the output exists."""
    for arch, extra, message in [
        (
            "olmo2",
            {},
            "model type 'olmo2' cannot be written as GGUF (these can: llama, mistral, qwen2, qwen3, "
            "gemma3_text, phi3)",
        ),
        ("gemma3_text", {"query_pre_attn_scalar": 48}, "query_pre_attn_scalar 48 cannot be exported"),
        ("gemma3_text", {"rope_local_base_freq": 20000.0}, "rope_local_base_freq 20000.0 cannot be exported"),
        ("gemma3_text", {"sliding_window_pattern": 4}, "sliding_window_pattern 4 cannot be exported"),
    ]:
        shutil.rmtree(tmp_path / "hf", ignore_errors=True)
        base = folder_base(tmp_path, bpe, arch, **extra)
        adapters = make_adapters(base, tmp_path / "adapters")
        out = tmp_path / "out.gguf"
        with pytest.raises(GGUFError) as raised:
            export(base, adapters, gguf_path=str(out))
        assert message in str(raised.value) and "\n" not in str(raised.value)
        assert not out.exists() and not list(tmp_path.glob(".out.gguf*"))
        failed = cli(adapters, "--gguf", out)
        assert failed.exit_code == 2 and len(failed.output.strip().splitlines()) == 1, failed.output
        assert message in failed.output and not out.exists()


def test_adapters_are_not_rounded_through_the_base_quantization(tmp_path, bpe):
    """A 4-bit base exported as f16: the stored q_proj is the dequantized base plus the exact LoRA update."""
    base = gguf_base(tmp_path, bpe, "llama", "Q4_0")
    adapters = make_adapters(base, tmp_path / "adapters")
    out = export(base, adapters, gguf_path=str(tmp_path / "out.gguf"))[0]
    a = np.array(mx.load(f"{adapters}/adapters.safetensors")["model.layers.1.self_attn.q_proj.lora_a"])
    b = np.array(mx.load(f"{adapters}/adapters.safetensors")["model.layers.1.self_attn.q_proj.lora_b"])
    base_reader = gguf.GGUFReader(base)
    q_base = next(t for t in base_reader.tensors if t.name == "blk.1.attn_q.weight")
    w_base = gguf.quants.dequantize(q_base.data, gguf.GGMLQuantizationType.Q4_0).reshape(
        64, 64
    )  # llama.cpp order
    exported = next(t for t in gguf.GGUFReader(str(out)).tensors if t.name == "blk.1.attn_q.weight")
    w_out = np.array(exported.data, dtype=np.float32).reshape(64, 64)
    delta = llama_cpp_order(LORA["scale"] * b.T @ a.T, heads=4)
    np.testing.assert_allclose(w_out, (w_base + delta).astype(np.float16).astype(np.float32), atol=2e-3)
    # Requantizing to 4 bits would have moved the update by about a quantization step.
    assert np.abs(w_out - w_base - delta).max() < 0.1 * np.abs(delta).max()


def test_export_of_a_folder_model_takes_its_tokenizer(tmp_path, bpe):
    """An HF-folder base: the GGUF tokenizer metadata comes from its tokenizer."""
    folder = tmp_path / "hf"
    build_hf_model(folder, "llama", len(bpe["tokens"]))
    write_hf_tokenizer(folder, bpe)
    adapters = make_adapters(str(folder), tmp_path / "adapters")
    out = export(str(folder), adapters, gguf_path=str(tmp_path / "out.gguf"))[0]
    fields = {name: f.contents() for name, f in gguf.GGUFReader(str(out)).fields.items()}
    _, tokenizer = load_policy(str(folder))
    assert fields["tokenizer.ggml.pre"] == "gpt-2"  # GPT-2's split, recognised from how it splits text
    assert (
        fields["tokenizer.ggml.tokens"] == bpe["tokens"] and fields["tokenizer.ggml.merges"] == bpe["merges"]
    )
    assert fields["tokenizer.ggml.token_type"] == bpe["types"]
    assert (fields["tokenizer.ggml.bos_token_id"], fields["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert fields["tokenizer.chat_template"] == tokenizer.chat_template
    fused, _, _, _ = load_fused(str(folder), adapters)
    reimported, again = mlx_lm_load(str(converted_folder(out)))
    assert relative_gap(logits(reimported), logits(fused)) < 2e-3
    for text in SAMPLE_TEXTS:
        assert again.encode(text) == tokenizer.encode(text), text
    try:
        import llama_cpp
    except ImportError:
        return
    vocab = llama_cpp.Llama(str(out), vocab_only=True, verbose=False)
    for text in SAMPLE_TEXTS:
        assert vocab.tokenize(text.encode(), add_bos=False, special=True) == tokenizer.encode(text), text


def test_mlx_folder_export(tmp_path, bpe):
    base = gguf_base(tmp_path, bpe, "qwen2", "Q4_0")
    adapters = make_adapters(base, tmp_path / "adapters")
    folder = export(base, adapters, mlx_path=str(tmp_path / "fused"))[0]
    model, tokenizer = mlx_lm_load(str(folder))
    unfused, _ = load_policy(base, adapters, keep_quantized=True)
    assert relative_gap(logits(model), logits(unfused)) < 2e-3  # float16 matmuls in the quantized reference
    assert tokenizer.encode("Hello 123") == load_policy(base, keep_quantized=True)[1].encode("Hello 123")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_llama_cpp_runs_the_exported_file(tmp_path, bpe, arch):
    llama_cpp = pytest.importorskip("llama_cpp")
    base = gguf_base(tmp_path, bpe, arch, "Q4_0")
    adapters = make_adapters(base, tmp_path / "adapters")
    out = export(base, adapters, gguf_path=str(tmp_path / "out.gguf"))[0]
    reimported, _ = mlx_lm_load(str(converted_folder(out)))
    runner = llama_cpp.Llama(str(out), n_ctx=64, n_threads=1, logits_all=True, verbose=False)
    tokens = list(PROMPT)
    runner.eval(tokens)
    for _ in range(6):
        tokens.append(int(np.argmax(runner.scores[runner.n_tokens - 1])))
        runner.eval(tokens[-1:])
    assert tokens[len(PROMPT) :] == greedy(reimported, n=6)
    # Greedy runs of a random model repeat themselves; the logits along the way say more.
    their_logits = np.array(runner.scores[: len(tokens) - 1])
    assert relative_gap(logits(reimported, tokens[:-1]), their_logits) < 5e-3


# ---------------------------------------------------------------------------
# The command line


def cli(*args):
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    return CliRunner().invoke(app, ["export", *map(str, args)], env={"COLUMNS": "400"})


def test_cli_export_and_its_errors(tmp_path, bpe):
    base = gguf_base(tmp_path, bpe, "qwen2", "F32")
    adapters = make_adapters(base, tmp_path / "adapters")
    no_base, lost_base = tmp_path / "no-base", tmp_path / "lost-base"
    for folder, config in (
        (no_base, {"fine_tune_type": "lora"}),
        (lost_base, {"model": str(tmp_path / "gone.gguf")}),
    ):
        shutil.copytree(adapters, folder)
        config_path = folder / "adapter_config.json"
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "model": None, **config}))
    done = cli(adapters, "--gguf", tmp_path / "out.gguf", "--outtype", "q8_0")
    assert done.exit_code == 0, done.output
    assert (tmp_path / "out.gguf").is_file() and "out.gguf" in done.output
    for args, message in [
        ((adapters, "--gguf", tmp_path / "out.gguf"), "exists"),
        ((adapters, "--gguf", tmp_path / "x.gguf", "--outtype", "q5_k"), "q5_k"),
        ((tmp_path / "hf", "--gguf", tmp_path / "y.gguf"), "no adapters"),
        ((tmp_path / "nowhere", "--gguf", tmp_path / "z.gguf"), "not found"),
        ((no_base, "--gguf", tmp_path / "z.gguf"), "does not name its base model"),
        ((lost_base, "--gguf", tmp_path / "z.gguf"), "model not found"),
    ]:
        failed = cli(*args)
        assert failed.exit_code == 2, (args, failed.output)
        assert message in failed.output and "Traceback" not in failed.output
        assert len(failed.output.strip().splitlines()) == 1, failed.output
    done = cli(adapters, "--gguf", tmp_path / "out.gguf", "--force")
    assert done.exit_code == 0, done.output


def test_export_needs_an_output(tmp_path):
    with pytest.raises(ExportError, match="--gguf"):
        export(None, None)


@pytest.mark.parametrize("outtype,expect", [("q4_k_m", {"Q4_K", "Q6_K"}), ("q6_k", {"Q6_K"})])
def test_k_quant_export_through_llama_cpp_and_back(tmp_path, bpe, outtype, expect):
    """Rows of 256 (hidden 256) so that llama.cpp writes K blocks; the file reads back in llama.cpp and
    here."""
    llama_cpp = pytest.importorskip("llama_cpp")
    config = build_hf_model(tmp_path / "hf", "qwen2", len(bpe["tokens"]), hidden=256, intermediate=512)
    base = str(write_gguf(tmp_path / "base.gguf", config, numpy_weights(tmp_path / "hf"), bpe))
    adapters = make_adapters(base, tmp_path / "adapters")
    out = export(base, adapters, gguf_path=str(tmp_path / "out.gguf"), outtype=outtype)[0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no partial files left
    types = {t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    assert expect <= types, types
    f16 = export(base, adapters, gguf_path=str(tmp_path / "f16.gguf"))[0]
    reimported, _ = mlx_lm_load(str(converted_folder(out)))  # K blocks read back by our own decoder
    exact, _ = mlx_lm_load(str(converted_folder(f16)))
    assert (
        relative_gap(logits(reimported), logits(exact)) < 0.25
    )  # random weights at 4-6 bits: the same model, rounded
    runner = llama_cpp.Llama(str(out), n_ctx=64, n_threads=1, logits_all=True, verbose=False)
    runner.eval(list(PROMPT))
    assert relative_gap(logits(reimported), np.array(runner.scores[: len(PROMPT)])) < 0.05


def test_k_quant_export_without_llama_cpp_names_the_extra(tmp_path, bpe, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_llama_cpp(name, *args, **kwargs):
        if name == "llama_cpp":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    base = gguf_base(tmp_path, bpe, "qwen2", "F32")
    monkeypatch.setattr(builtins, "__import__", no_llama_cpp)
    with pytest.raises(ExportError, match=r"llama-cpp-python: pip install -e \".\[llamacpp\]\""):
        export(base, None, gguf_path=str(tmp_path / "out.gguf"), outtype="q4_k_m")
    assert not (tmp_path / "out.gguf").exists()
