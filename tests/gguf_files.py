"""Tiny GGUF files for tests, written with the `gguf` package (llama.cpp's own writer).

Written independently of mlx_grpo/models/: the tensor names come from the
`gguf` package's own Hugging Face -> llama.cpp table (tensor_mapping.py, what
llama.cpp's converter uses); its Q/K row permutation for llama files, Gemma's
norms stored plus one, the metadata keys each architecture's converter writes
and the quantizers of the `gguf` package are spelled out here again, so that an
import that gets any of them wrong disagrees with these files.

The models are random models built with mlx-lm's own classes (llama, mistral,
qwen2, qwen3, gemma3_text, phi3) in Hugging Face layout, with a small
byte-level BPE trained here on varied text (words, digits, code, whitespace
runs, accented and non-Latin letters), so that tokenization has real merges to
get right (a gemma file with a BPE is still a gemma file to llama.cpp).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "She said: it's 12345 + 678 = 13023, isn't it? We'll see; they'd know.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i ** 2)\n",
    "    indented\tand\ttabbed   spaces    everywhere  \n\n\n",
    "Café déjà vu, naïve façade; Straße; Ελληνικά; русский текст; 日本語のテキスト; 中文字符; 😀🎉",
    "#### 42\nAnswer with only the final number. 3.14159 2,718 1e10 0x1F",
    '<div class="x">{"key": [1, 2, 3]}</div> // comment /* block */',
] * 3
# What the tokenizer tests encode: every kind of text above, and some it never saw.
SAMPLE_TEXTS = [
    "Hello world! 123 4567 89",
    "  multiple   spaces\tand\ttabs\n\n\nnewlines  ",
    "Café déjà vu, 日本語, Ελληνικά, emoji 😀🎉 and ﬁ ligature",
    "def f(x):\n    return {'a': [x ** 2 for x in range(3)]}  # code",
    "it's they'll I'M WE'RE don't 'quoted'",
    "1+1=2; 12,345.678; -0.5e-3; 2024-11-23",
    "",
    " ",
    "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n",
]
# Model type -> (mlx-lm's module, llama.cpp's general.architecture, config of a tiny model beyond the common
# one).
# The extras make each architecture's peculiarities matter: head sizes other than hidden/heads, a sliding
# window shorter than the test prompts with a global layer among the local ones, rope on part of each head.
MODEL_TYPES = {
    "llama": ("llama", "llama", {}),
    "mistral": ("llama", "llama", {"sliding_window": None}),  # llama.cpp's converter writes Mistral as llama
    "qwen2": ("qwen2", "qwen2", {}),
    "qwen3": ("qwen3", "qwen3", {"head_dim": 32}),
    "gemma3_text": (
        "gemma3_text",
        "gemma3",
        {
            "head_dim": 32,
            "query_pre_attn_scalar": 32,
            "sliding_window": 4,
            "sliding_window_pattern": 6,
            "rope_local_base_freq": 10000.0,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "num_hidden_layers": 6,
        },
    ),
    "phi3": ("phi3", "phi3", {"partial_rotary_factor": 0.5, "original_max_position_embeddings": 512}),
    "olmo2": ("olmo2", "olmo2", {}),  # one llama.cpp knows and we do not (for the refusals)
}


def train_bpe(vocab_size: int = 320) -> dict:
    """A byte-level BPE trained on CORPUS: {"tokens", "merges", "types"} as a GGUF stores them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    saved = json.loads(tok.to_str())
    vocab = saved["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in saved["model"]["merges"]]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    return {"tokens": tokens, "merges": merges, "types": types, "json": tok.to_str()}


def write_hf_tokenizer(folder: Path, bpe: dict) -> None:
    """The trained BPE as a Hugging Face tokenizer (GPT-2's byte-level split) with the chat template."""
    from tokenizers import Tokenizer, decoders

    tok = Tokenizer.from_str(bpe["json"])
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": SPECIALS[1],
                "eos_token": SPECIALS[2],
                "pad_token": SPECIALS[2],
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )


def model_class(model_type: str):
    """mlx-lm's module for a model type (mistral runs as llama there)."""
    import importlib

    return importlib.import_module(f"mlx_lm.models.{MODEL_TYPES[model_type][0]}")


def build_hf_model(
    folder: Path,
    arch: str,
    vocab: int,
    hidden: int = 64,
    layers: int | None = None,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    tied: bool = True,
    seed: int = 0,
    **extra,
) -> dict:
    """A random model of mlx-lm model type `arch` in Hugging Face layout (config.json + model.safetensors)."""
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "eos_token_id": 2,
        "bos_token_id": 1,
        **MODEL_TYPES[arch][2],
        **extra,
    }
    if layers is not None:
        config["num_hidden_layers"] = layers
    module = model_class(arch)
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    # Norm weights away from their start and biases away from 0, so that a misplaced one shows.
    params = {
        k: (v + mx.random.normal(v.shape) * 0.2 if v.ndim == 1 else v)
        for k, v in tree_flatten(model.parameters())
        if not (tied and k == "lm_head.weight")
    }
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), params)
    (folder / "config.json").write_text(json.dumps(config))
    return config


def hf_model(weights: dict, config: dict, **overrides):
    """An mlx-lm model of `config` holding `weights` (NumPy or MLX, Hugging Face names)."""
    module = model_class(config["model_type"])
    model = module.Model(module.ModelArgs.from_dict({**config, **overrides}))
    weights = {k: mx.array(v) for k, v in weights.items()}
    if hasattr(model, "sanitize"):  # gemma3 learns here that its embeddings are tied
        weights = model.sanitize(weights)
    model.load_weights(list(weights.items()))
    return model


def llama_cpp_order(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf row order for llama Q/K: interleave the two halves of each head."""
    out_rows = w.shape[0]
    return w.reshape(heads, 2, out_rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(name: str, model_type: str = "llama") -> str:
    """llama.cpp's name of a Hugging Face tensor, from the `gguf` package's converter table."""
    import gguf

    arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[MODEL_TYPES[model_type][1]]
    found = gguf.get_tensor_name_map(arch, 64).get_name(name, try_suffixes=(".weight", ".bias"))
    assert found, f"{name} has no llama.cpp name in {model_type}"
    return found


def gguf_tensors(weights: dict[str, np.ndarray], config: dict) -> dict[str, np.ndarray]:
    """Hugging Face tensors as llama.cpp's converter stores them: its names, llama's Q/K rows permuted
    (Mistral's too: it is converted as llama), Gemma's norm weights plus one (Gemma's RMSNorm scales by 1 +
    w)."""
    model_type = config["model_type"]
    out = {}
    for name, w in weights.items():
        if model_type in ("llama", "mistral") and (".q_proj." in name or ".k_proj." in name):
            w = llama_cpp_order(
                w, config["num_attention_heads"] if ".q_proj." in name else config["num_key_value_heads"]
            )
        if model_type == "gemma3_text" and name.endswith("norm.weight"):
            w = w + 1.0
        out[gguf_name(name, model_type)] = w
    return out


def _architecture_metadata(writer, config: dict, prefix: str) -> None:
    """The keys llama.cpp's converter writes for each architecture (convert_hf_to_gguf.py), named prefix.*."""
    arch = MODEL_TYPES[config["model_type"]][1]
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    for key, value in (
        ("context_length", config["max_position_embeddings"]),
        ("embedding_length", hidden),
        ("block_count", config["num_hidden_layers"]),
        ("feed_forward_length", config["intermediate_size"]),
        ("attention.head_count", heads),
        ("attention.head_count_kv", config["num_key_value_heads"]),
    ):
        writer.add_uint32(f"{prefix}.{key}", value)
    writer.add_float32(f"{prefix}.rope.freq_base", config["rope_theta"])
    writer.add_float32(f"{prefix}.attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    if arch == "phi3":  # rope on part of each head; llama.cpp ignores phi3's sliding window
        writer.add_uint32(
            f"{prefix}.rope.dimension_count", int(config["partial_rotary_factor"] * hidden) // heads
        )
        writer.add_uint32(
            f"{prefix}.rope.scaling.original_context_length", config["original_max_position_embeddings"]
        )
        writer.add_uint32(f"{prefix}.attention.sliding_window", 0)
    elif arch in ("llama", "qwen2"):
        writer.add_uint32(f"{prefix}.rope.dimension_count", head_dim)
    if "head_dim" in config:  # qwen3 and gemma3 (no rope.dimension_count: llama.cpp takes the key length)
        writer.add_uint32(f"{prefix}.attention.key_length", head_dim)
        writer.add_uint32(f"{prefix}.attention.value_length", head_dim)
    if arch == "gemma3" and config["sliding_window_pattern"] != 1:
        writer.add_uint32(f"{prefix}.attention.sliding_window", config["sliding_window"])


def write_gguf(
    path: Path,
    config: dict,
    weights: dict[str, np.ndarray],
    bpe: dict,
    pre: str = "qwen2",
    tensor_type: str = "F32",
    arch: str | None = None,
    add_bos: bool = False,
    raw: dict[str, str] | None = None,
    blocks: dict[str, tuple[str, np.ndarray]] | None = None,
    spm: dict | None = None,
) -> Path:
    """A GGUF file of a Hugging Face model: 2-D weights stored as tensor_type, 1-D ones as F32.

    raw: {gguf tensor name: type} of tensors written as zero bytes of that type
    (types the `gguf` package cannot quantize to, for error tests).
    blocks: {gguf tensor name: (type, its bytes)} written as given (K-quant blocks made by a test).
    spm: a SentencePiece vocabulary's tokenizer.ggml.* metadata, written instead of the BPE's.
    """
    import gguf

    arch = arch or MODEL_TYPES[config["model_type"]][1]
    qtype = gguf.GGMLQuantizationType[tensor_type]
    writer = gguf.GGUFWriter(str(path), arch)
    _architecture_metadata(writer, config, arch)
    writer.add_uint32("general.file_type", 0)
    if spm is not None:
        writer.add_string("tokenizer.ggml.model", "llama")
        writer.add_array("tokenizer.ggml.tokens", spm["tokenizer.ggml.tokens"])
        writer.add_array("tokenizer.ggml.scores", spm["tokenizer.ggml.scores"])
        writer.add_array("tokenizer.ggml.token_type", spm["tokenizer.ggml.token_type"])
        for key in ("bos", "eos", "unknown"):
            writer.add_uint32(f"tokenizer.ggml.{key}_token_id", spm[f"tokenizer.ggml.{key}_token_id"])
        writer.add_bool("tokenizer.ggml.add_space_prefix", spm["tokenizer.ggml.add_space_prefix"])
    else:
        writer.add_string("tokenizer.ggml.model", "gpt2")
        writer.add_string("tokenizer.ggml.pre", pre)
        writer.add_array("tokenizer.ggml.tokens", bpe["tokens"])
        writer.add_array("tokenizer.ggml.token_type", bpe["types"])
        writer.add_array("tokenizer.ggml.merges", bpe["merges"])
        writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
        writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
        writer.add_uint32("tokenizer.ggml.padding_token_id", 2)
    writer.add_bool("tokenizer.ggml.add_bos_token", add_bos)
    writer.add_string("tokenizer.chat_template", CHAT_TEMPLATE)
    for name, w in gguf_tensors(weights, config).items():
        if name in (blocks or {}):
            writer.add_tensor(name, blocks[name][1], raw_dtype=gguf.GGMLQuantizationType[blocks[name][0]])
        elif name in (raw or {}):
            rtype = gguf.GGMLQuantizationType[raw[name]]
            writer.add_tensor(
                name,
                np.zeros(gguf.quants.quant_shape_to_byte_shape(w.shape, rtype), np.uint8),
                raw_dtype=rtype,
            )
        elif w.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, w.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w.astype(np.float32), qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def stored_values(weights: dict[str, np.ndarray], tensor_type: str) -> dict[str, np.ndarray]:
    """The weights as a reader of the file gets them back: 2-D ones through the type's round trip (NumPy)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[tensor_type]
    return {
        k: (
            w
            if w.ndim == 1
            else gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)
            .astype(np.float32)
            .reshape(w.shape)
        )
        for k, w in weights.items()
    }


def numpy_weights(folder: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(folder / "model.safetensors")).items()}


# ---------------------------------------------------------------------------
# A reference tokenizer, written out plainly: llama.cpp's splits, then byte-level BPE by merge rank

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_START = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
_LLAMA3_END = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# As in llama.cpp's src/llama-vocab.cpp (llm_tokenizer_bpe), by tokenizer.ggml.pre.
LLAMA_CPP_SPLITS = {
    "gpt-2": [_GPT2],
    "smollm": [r"\p{N}", _GPT2],
    "qwen2": [_LLAMA3_START + r"\p{N}" + _LLAMA3_END],
    "llama-bpe": [_LLAMA3_START + r"\p{N}{1,3}" + _LLAMA3_END],
}


def byte_to_char() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (printable Latin-1 bytes stand for themselves)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {b: chr(b) if b in keep else chr(next(extra)) for b in range(256)}


def reference_encode(
    text: str, tokens: list[str], merges: list[str], types: list[int], pre: str
) -> list[int]:
    import regex

    ids = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ", 1)): rank for rank, m in enumerate(merges)}
    specials = sorted((t for t, kind in zip(tokens, types) if kind == 3), key=len, reverse=True)
    chars = byte_to_char()
    out = []
    # Special tokens are matched first, anywhere; only the text between them is split and merged.
    chunks = regex.split("(" + "|".join(map(regex.escape, specials)) + ")", text) if specials else [text]
    for chunk in chunks:
        if chunk in specials:
            out.append(ids[chunk])
            continue
        pieces = [chunk] if chunk else []
        for pattern in LLAMA_CPP_SPLITS[pre]:
            split = []
            for piece in pieces:
                end = 0
                for match in regex.finditer(pattern, piece):
                    split += [piece[end : match.start()], match.group()]
                    end = match.end()
                split.append(piece[end:])
            pieces = [p for p in split if p]
        for piece in pieces:
            word = "".join(chars[b] for b in piece.encode("utf-8"))
            if pre == "llama-bpe" and word in ids:  # llama-3 takes whole words found in the vocabulary
                out.append(ids[word])
                continue
            symbols = list(word)
            while len(symbols) > 1:
                pairs = [(ranks.get(pair, len(ranks)), i) for i, pair in enumerate(zip(symbols, symbols[1:]))]
                rank, i = min(pairs)
                if rank == len(ranks):
                    break
                symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
            out += [ids[s] for s in symbols]
    return out
