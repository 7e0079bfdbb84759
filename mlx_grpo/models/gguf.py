"""GGUF files (llama.cpp, Ollama, LM Studio) as a model source.

A GGUF file is converted once into an ordinary mlx-lm model folder
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json),
cached under ~/.cache/mlx-grpo/gguf/ by the file's path, size and
modification time; after that it loads like any other mlx-lm model, and
adapters load on top with mlx-lm's own code.

Quantized tensors stay quantized: `mx.load` reads Q4_0, Q4_1 and Q8_0 blocks
as MLX affine quantization in groups of 32 (packed weights, scales, biases),
exactly. Any other tensor type is refused by name rather than widened.

llama.cpp stores the query and key rows of llama-architecture files permuted:
its rope rotates interleaved pairs of a head, Hugging Face's (and mlx-lm's
default) the two halves. The rows are put back in Hugging Face order here, so
the folder is a plain HF-layout llama and adapters trained on it suit the
original model. Qwen2 files are stored unpermuted (llama.cpp runs Qwen2 with
half-split rope).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import mlx.core as mx

from .gguf_file import TENSOR_TYPES, GGUFError, GGUFHeader, read_header
from .gguf_tokenizer import write_tokenizer

__all__ = ["GGUFError", "converted_folder", "is_gguf"]

ARCHITECTURES = ("llama", "qwen2")
GROUP_SIZE = 32  # every GGUF quantization MLX reads uses blocks of 32
# Changing how files are converted must not reuse folders converted the old way.
CONVERTER_VERSION = 1

# llama.cpp's tensor names -> Hugging Face's (blk.N.* are inside model.layers.N).
_TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_IN_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf") and Path(path).expanduser().is_file()


# ---------------------------------------------------------------------------
# Names, config and weights


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for a tensor we do not map."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        return f"model.layers.{layer}.{_IN_LAYER[part]}.{suffix}" if part in _IN_LAYER else None
    return f"{_TOP_LEVEL[stem]}.{suffix}" if stem in _TOP_LEVEL else None


def model_config(header: GGUFHeader) -> dict:
    """config.json of the equivalent Hugging Face model, from the GGUF metadata."""
    meta = header.metadata
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")

    def get(key, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise GGUFError(f"the GGUF file has no {arch}.{key}")
        return value

    names = {t.name for t in header.tensors}
    if "rope_freqs.weight" in names or meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", "linear"):
        raise GGUFError("GGUF rope scaling other than linear (e.g. llama 3.1's rope_freqs) is not supported")
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    if int(meta.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise GGUFError("GGUF models whose rope covers part of each head are not supported")
    embedding = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise GGUFError("the GGUF file has no token_embd.weight")
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length")),
        "vocab_size": int(embedding.shape[0]),
        "tie_word_embeddings": "output.weight" not in names,
    }
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(get("rope.scaling.factor"))}
    for key, hf_key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id")):
        if f"tokenizer.ggml.{key}_token_id" in meta:
            config[hf_key] = int(meta[f"tokenizer.ggml.{key}_token_id"])
    return config


def llama_cpp_rows_to_hf(w: mx.array, heads: int) -> mx.array:
    """Undo llama.cpp's Q/K permutation: a head's even rows are its first half, its odd rows its second.

    Works on any array whose first axis is the output rows: a weight, a bias,
    or the packed weights, scales and biases of a quantized weight.
    """
    return w.reshape(heads, -1, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_rows_to_llama_cpp(w: mx.array, heads: int) -> mx.array:
    """llama.cpp's Q/K row order from Hugging Face's (the inverse of llama_cpp_rows_to_hf)."""
    return w.reshape(heads, 2, -1, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_tensor_types(header: GGUFHeader) -> None:
    for t in header.tensors:
        if t.type_id not in TENSOR_TYPES:
            readable = ", ".join(name for name, _, _ in TENSOR_TYPES.values())
            raise GGUFError(f"GGUF tensor {t.name} has type {t.type_name}, which MLX does not read "
                            f"(readable: {readable}); use a file quantized as Q8_0, Q4_0 or Q4_1, or F16")


def hf_weights(arrays: dict[str, mx.array], config: dict) -> dict[str, mx.array]:
    """The tensors `mx.load` read, under Hugging Face names, Q/K rows in Hugging Face order."""
    weights = {}
    for name, array in arrays.items():
        target = hf_name(name)
        if target is None:
            raise GGUFError(f"GGUF tensor {name} has no place in a {config['model_type']} model")
        if config["model_type"] == "llama" and ".q_proj." in target:
            array = llama_cpp_rows_to_hf(array, config["num_attention_heads"])
        elif config["model_type"] == "llama" and ".k_proj." in target:
            array = llama_cpp_rows_to_hf(array, config["num_key_value_heads"])
        weights[target] = array
    return weights


def quantization_config(weights: dict[str, mx.array]) -> dict | None:
    """mlx-lm's "quantization" entry: the most common bit width, and each module that differs."""
    bits = {name[: -len(".scales")]: weights[name[: -len(".scales")] + ".weight"].shape[-1] * 32
            // (weights[name].shape[-1] * GROUP_SIZE)
            for name in weights if name.endswith(".scales")}
    if not bits:
        return None
    common = Counter(bits.values()).most_common(1)[0][0]
    config = {"group_size": GROUP_SIZE, "bits": common}
    config.update({module: {"group_size": GROUP_SIZE, "bits": b} for module, b in bits.items() if b != common})
    return config


def convert(path: str | Path, folder: Path) -> None:
    """Write the mlx-lm folder of a GGUF file."""
    header = read_header(path)
    config = model_config(header)
    check_tensor_types(header)
    try:
        arrays = mx.load(str(path), format="gguf")  # whatever the file is called
    except (RuntimeError, ValueError) as e:
        raise GGUFError(f"{path}: {str(e).strip().splitlines()[0]}") from None
    weights = hf_weights(arrays, config)
    quantization = quantization_config(weights)
    if quantization:
        config["quantization"] = quantization
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(header.metadata, folder, config["max_position_embeddings"])
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


# ---------------------------------------------------------------------------
# The cache of converted folders


def cache_root() -> Path:
    return Path(os.environ.get("MLX_GRPO_CACHE") or Path.home() / ".cache" / "mlx-grpo")


def converted_folder(path: str | Path) -> Path:
    """The mlx-lm folder of a GGUF file: converted on first use, then reused while the file is unchanged."""
    source = Path(path).expanduser().resolve()
    stat = source.stat()
    key = f"{source}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERTER_VERSION}"
    folder = cache_root() / "gguf" / f"{source.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if (folder / "config.json").is_file():
        return folder
    # Written beside its final name and renamed: a reader never sees half a folder,
    # and two processes converting the same file at once both end with a whole one.
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        try:
            partial.mkdir(parents=True)
        except OSError as e:
            raise GGUFError(f"cannot write the converted model under {cache_root()} ({e.strerror or e}); "
                            "set MLX_GRPO_CACHE to a writable folder") from None
        convert(source, partial)
        (partial / "source.json").write_text(json.dumps({"gguf": str(source), "size": stat.st_size,
                                                         "mtime_ns": stat.st_mtime_ns}), encoding="utf-8")
        try:
            partial.rename(folder)
        except OSError:
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder
