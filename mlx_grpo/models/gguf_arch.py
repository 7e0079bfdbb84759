"""llama.cpp's conventions for the architectures it shares with mlx-lm, one table for both directions.

Import (gguf.py) reads a GGUF file's metadata and tensor names into an mlx-lm
model folder; export (export.py) writes them back. What each architecture
keeps differently from Hugging Face, as llama.cpp's converter
(convert_hf_to_gguf.py) writes it and its loader (src/llama-model.cpp) reads it:

- llama (Mistral's files are llama files too): the query and key rows are
  permuted, for llama.cpp's rope that rotates interleaved pairs of a head
  where Hugging Face's rotates its two halves. qwen2/qwen3/gemma3/phi3 are
  stored unpermuted (llama.cpp runs them with half-split rope).
- qwen3: per-head RMS norms of the queries and keys (attn_q_norm, attn_k_norm).
- gemma3: every norm weight is stored plus one (Gemma's RMSNorm multiplies by
  1 + w); four norms a layer (attn_norm, post_attention_norm, ffn_norm before
  the MLP, post_ffw_norm); q/k norms. The file carries the sliding window but
  not its layer pattern, the local rope base nor the attention scale: llama.cpp
  fixes them (every 6th layer global, base 10000, 1/sqrt(head_dim), except
  the 62-layer 27B's 1/sqrt(hidden/heads)), and so do we, both ways. The
  embedding scale sqrt(hidden) is not stored either: mlx-lm's model applies it.
- phi3: the fused qkv_proj and gate_up_proj stay fused (attn_qkv, ffn_up);
  rope may cover part of each head (rope.dimension_count).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from .gguf_file import GGUFError, GGUFHeader


@dataclass(frozen=True)
class Architecture:
    name: str  # general.architecture
    model_type: str  # mlx-lm's model_type of an imported file
    layer_names: dict  # llama.cpp's name inside blk.N -> Hugging Face's inside model.layers.N
    permuted_qk: bool = False
    norm_shift: float = 0.0  # what the converter added to every norm weight


_ATTENTION = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_PRE_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_LLAMA = {**_PRE_NORMS, **_ATTENTION, **_MLP}

ARCHITECTURES = {
    a.name: a
    for a in (
        Architecture("llama", "llama", _LLAMA, permuted_qk=True),
        Architecture("qwen2", "qwen2", _LLAMA),
        Architecture("qwen3", "qwen3", {**_LLAMA, **_QK_NORMS}),
        Architecture(
            "gemma3",
            "gemma3_text",
            {
                "attn_norm": "input_layernorm",
                "post_attention_norm": "post_attention_layernorm",
                "ffn_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm",
                **_ATTENTION,
                **_QK_NORMS,
                **_MLP,
            },
            norm_shift=1.0,
        ),
        Architecture(
            "phi3",
            "phi3",
            {
                **_PRE_NORMS,
                "attn_qkv": "self_attn.qkv_proj",
                "attn_output": "self_attn.o_proj",
                "ffn_up": "mlp.gate_up_proj",
                "ffn_down": "mlp.down_proj",
            },
        ),
    )
}
# mlx-lm model types that export to GGUF -> the architecture llama.cpp knows them as
# (mlx-lm runs "mistral" as llama, and llama.cpp's converter writes Mistral as llama).
EXPORTED_MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
}
_BY_MODEL_TYPE = {
    **{a.model_type: a for a in ARCHITECTURES.values()},
    **{t: ARCHITECTURES[a] for t, a in EXPORTED_MODEL_TYPES.items()},
}
TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# What llama.cpp fixes for gemma3 rather than reading from the file.
GEMMA3_LAYER_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0


def architecture(name) -> Architecture:
    """The architecture of a GGUF file's general.architecture, or one line saying it is not supported."""
    if name not in ARCHITECTURES:
        raise GGUFError(
            f"GGUF architecture {name!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    return ARCHITECTURES[name]


def of_model_type(model_type) -> Architecture:
    """The GGUF architecture an mlx-lm model type is written as, or one line saying it cannot be."""
    if model_type not in _BY_MODEL_TYPE:
        raise GGUFError(
            f"model type {model_type!r} cannot be written as GGUF "
            f"(these can: {', '.join(EXPORTED_MODEL_TYPES)})"
        )
    return _BY_MODEL_TYPE[model_type]


# ---------------------------------------------------------------------------
# Tensor names and stored values


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for a tensor we do not map."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        names = ARCHITECTURES[arch].layer_names
        return f"model.layers.{layer}.{names[part]}.{suffix}" if part in names else None
    return f"{TOP_LEVEL[stem]}.{suffix}" if stem in TOP_LEVEL else None


def gguf_name(name: str, arch: str = "llama") -> str:
    """`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight` (the inverse of hf_name)."""
    stem, _, kind = name.rpartition(".")
    top = {hf: gguf for gguf, hf in TOP_LEVEL.items()}
    if stem in top:
        return f"{top[stem]}.{kind}"
    parts = stem.split(".", 3)
    in_layer = {hf: gguf for gguf, hf in ARCHITECTURES[arch].layer_names.items()}
    if stem.startswith("model.layers.") and len(parts) == 4 and parts[3] in in_layer:
        return f"blk.{parts[2]}.{in_layer[parts[3]]}.{kind}"
    raise GGUFError(f"tensor {name} has no llama.cpp name in a {arch} model")


def llama_cpp_rows_to_hf(w: mx.array, heads: int) -> mx.array:
    """Undo llama.cpp's Q/K permutation: a head's even rows are its first half, its odd rows its second.

    Works on any array whose first axis is the output rows: a weight, a bias,
    or the packed weights, scales and biases of a quantized weight.
    """
    return w.reshape(heads, -1, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_rows_to_llama_cpp(w: mx.array, heads: int) -> mx.array:
    """llama.cpp's Q/K row order from Hugging Face's (the inverse of llama_cpp_rows_to_hf)."""
    return w.reshape(heads, 2, -1, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _qk_heads(name: str, arch: Architecture, config: dict) -> int | None:
    """How many heads to permute the rows of `name` (a Hugging Face name) by; None when not permuted."""
    if not arch.permuted_qk:
        return None
    if ".self_attn.q_proj." in name:
        return config["num_attention_heads"]
    if ".self_attn.k_proj." in name:
        return config.get("num_key_value_heads") or config["num_attention_heads"]
    return None


def _shifted(name: str, arch: Architecture) -> bool:
    return bool(arch.norm_shift) and name.endswith("norm.weight")


def hf_weights(arrays: dict[str, mx.array], config: dict) -> dict[str, mx.array]:
    """The tensors `mx.load` read, under Hugging Face names and in Hugging Face's conventions."""
    arch = of_model_type(config["model_type"])
    weights = {}
    for name, array in arrays.items():
        target = hf_name(name, arch.name)
        if target is None:
            raise GGUFError(f"GGUF tensor {name} has no place in a {arch.name} model")
        heads = _qk_heads(target, arch, config)
        if heads:
            array = llama_cpp_rows_to_hf(array, heads)
        if _shifted(target, arch):
            array = (array - arch.norm_shift).astype(array.dtype)
        weights[target] = array
    return weights


def to_gguf(name: str, w: mx.array, config: dict) -> tuple[str, mx.array]:
    """A Hugging Face tensor as llama.cpp stores it: (its GGUF name, its values)."""
    arch = of_model_type(config["model_type"])
    heads = _qk_heads(name, arch, config)
    if heads:
        w = hf_rows_to_llama_cpp(w, heads)
    if _shifted(name, arch):
        w = w + arch.norm_shift
    return gguf_name(name, arch.name), w


# ---------------------------------------------------------------------------
# Metadata


def model_config(header: GGUFHeader) -> dict:
    """config.json of the equivalent Hugging Face model, from the GGUF metadata."""
    meta = header.metadata
    arch = architecture(meta.get("general.architecture"))
    prefix = arch.name

    def get(key, default=None):
        value = meta.get(f"{prefix}.{key}", default)
        if value is None:
            raise GGUFError(f"the GGUF file has no {prefix}.{key}")
        return value

    names = {t.name for t in header.tensors}
    if (
        "rope_freqs.weight" in names
        or any(n.startswith("rope_factors") for n in names)
        or meta.get(f"{prefix}.rope.scaling.type", "none") not in ("none", "linear")
    ):
        raise GGUFError(
            "GGUF rope scaling other than linear (e.g. llama 3.1's rope_freqs, Phi-3's long-context "
            "rope factors) is not supported"
        )
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise GGUFError("GGUF models whose attention values and keys differ in length are not supported")
    rope_dims = int(get("rope.dimension_count", head_dim))
    if rope_dims != head_dim and arch.name != "phi3":
        raise GGUFError("GGUF models whose rope covers part of each head are not supported")
    embedding = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise GGUFError("the GGUF file has no token_embd.weight")
    config = {
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length")),
        "vocab_size": int(embedding.shape[0]),
        "tie_word_embeddings": "output.weight" not in names,
    }
    if meta.get(f"{prefix}.rope.scaling.type") == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(get("rope.scaling.factor"))}
    if arch.name == "gemma3":
        config.update(_gemma3_config(meta, config))
    elif arch.name == "phi3":
        if head_dim != hidden // heads:
            raise GGUFError("GGUF phi3 models whose head size is not hidden size / heads are not supported")
        config["partial_rotary_factor"] = rope_dims / head_dim
        config["original_max_position_embeddings"] = int(
            get("rope.scaling.original_context_length", config["max_position_embeddings"])
        )
    for key, hf_key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id")):
        if f"tokenizer.ggml.{key}_token_id" in meta:
            config[hf_key] = int(meta[f"tokenizer.ggml.{key}_token_id"])
    return config


def gemma3_attention_scalar(config: dict) -> int:
    """The query_pre_attn_scalar llama.cpp assumes (it is not in the file): head_dim, but hidden/heads at 62
    layers."""
    if config["num_hidden_layers"] == 62:  # Gemma 3 27B, as llama.cpp tells it apart
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def _gemma3_config(meta: dict, config: dict) -> dict:
    if meta.get("gemma3.final_logit_softcapping"):
        raise GGUFError("GGUF gemma3 models with final logit softcapping are not supported")
    window = int(meta.get("gemma3.attention.sliding_window", 0))
    # Without a window every layer is global (llama.cpp's reading of a file that has none).
    return {
        "query_pre_attn_scalar": gemma3_attention_scalar(config),
        "sliding_window": window or config["max_position_embeddings"],
        "sliding_window_pattern": GEMMA3_LAYER_PATTERN if window else 1,
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_BASE,
    }


def check_exportable(config: dict) -> Architecture:
    """The architecture `config` is written as; one line if GGUF cannot say what the model computes."""
    arch = of_model_type(config["model_type"])
    rope_scaling = config.get("rope_scaling")
    if rope_scaling and rope_scaling.get("type", rope_scaling.get("rope_type")) not in ("linear", "default"):
        raise GGUFError(f"rope scaling {rope_scaling} cannot be exported to GGUF (only linear)")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if arch.name == "gemma3":
        fixed = {
            "query_pre_attn_scalar": gemma3_attention_scalar({**config, "head_dim": head_dim}),
            "rope_local_base_freq": GEMMA3_LOCAL_ROPE_BASE,
        }
        for key, value in fixed.items():
            if float(config[key]) != value:
                raise GGUFError(
                    f"a gemma3 model with {key} {config[key]} cannot be exported to GGUF "
                    f"(llama.cpp assumes {value})"
                )
        if config["sliding_window_pattern"] not in (1, GEMMA3_LAYER_PATTERN):
            raise GGUFError(
                f"a gemma3 model with sliding_window_pattern {config['sliding_window_pattern']} "
                f"cannot be exported to GGUF (llama.cpp assumes {GEMMA3_LAYER_PATTERN})"
            )
    return arch


def write_metadata(writer, config: dict) -> None:
    """The architecture metadata llama.cpp's converter writes for `config` (a gguf.GGUFWriter of its arch)."""
    arch = check_exportable(config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_context_length(int(config.get("max_position_embeddings") or 4096))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    if arch.name == "phi3":
        writer.add_rope_dimension_count(int(head_dim * config.get("partial_rotary_factor", 1.0)))
        writer.add_rope_scaling_orig_ctx_len(int(config.get("original_max_position_embeddings") or 4096))
        writer.add_sliding_window(int(config.get("sliding_window") or 0))
    elif arch.name != "gemma3":
        writer.add_rope_dimension_count(head_dim)
    if head_dim != config["hidden_size"] // heads or arch.name == "gemma3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(config["vocab_size"])
    if arch.name == "gemma3" and config["sliding_window_pattern"] != 1:
        writer.add_sliding_window(int(config["sliding_window"]))
    rope_scaling = config.get("rope_scaling")
    if rope_scaling and rope_scaling.get("type", rope_scaling.get("rope_type")) == "linear":
        writer.add_string(f"{arch.name}.rope.scaling.type", "linear")
        writer.add_float32(f"{arch.name}.rope.scaling.factor", float(rope_scaling["factor"]))
