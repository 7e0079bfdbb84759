"""The tokenizer of a GGUF file, rebuilt as a Hugging Face `tokenizers` BPE.

SentencePiece vocabularies (Gemma, Llama 2, Mistral) are built in
gguf_spm.py; this module does byte-level BPE and the files' common settings.
A GGUF file carries its byte-level BPE as lists (tokens, merges, token types)
and names its pre-tokenizer (`tokenizer.ggml.pre`): the regular expressions
that cut text into words before BPE runs on each word. llama.cpp keeps those
expressions in its source, keyed by that name; the ones of the llama-family
and Qwen2 files are written out below. A name not listed is an error, not a
guess: a wrong split gives valid-looking but different token ids, and a model
fed tokens it was not trained on degrades without any message.
"""

from __future__ import annotations

import json
from pathlib import Path

from .gguf_file import GGUFError
from .gguf_spm import build_spm_tokenizer

# The GPT-2 pattern: contractions, letters, digits, other symbols, whitespace.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"


def _llama3_like(digits: str) -> str:
    return (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|" + digits
            + r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"  # DeepSeek's runs of CJK (and other) letters

# tokenizer.ggml.pre -> the splits applied in turn (each cuts the pieces the previous left).
PRE_TOKENIZERS = {
    "gpt-2": [_GPT2],
    "smollm": [r"\p{N}", _GPT2],  # single digits first, then GPT-2's split
    "llama-bpe": [_llama3_like(r"\p{N}{1,3}")],  # runs of up to three digits
    "qwen2": [_llama3_like(r"\p{N}")],  # single digits
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"],
    "deepseek-v3": [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
}
# Keys above are the names llama.cpp writes and reads; these other spellings mean the same split
# (llama.cpp groups them so: the same expressions under another model's name).
PRE_TOKENIZER_ALIASES = {
    "gpt2": "gpt-2", "mpt": "gpt-2", "olmo": "gpt-2", "jais": "gpt-2",
    "llama3": "llama-bpe", "llama-v3": "llama-bpe", "dbrx": "llama-bpe", "smaug-bpe": "llama-bpe",
    "starcoder": "smollm", "refact": "smollm", "command-r": "smollm", "codeshell": "smollm", "exaone": "smollm",
    "deepseek-r1-qwen": "qwen2",
}
# llama.cpp's settings per pre-tokenizer: llama3 matches whole words in the vocabulary
# before merging, adds BOS by default, and only some decoders tidy spaces before punctuation.
_IGNORE_MERGES = {"llama-bpe"}
_ADD_BOS_DEFAULT = {"llama-bpe"}
_CLEAN_SPACES = {"gpt-2", "llama-bpe", "falcon", "smollm"}

# tokenizer.ggml.token_type values
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
# Text whose pre-tokenization tells the supported pre-tokenizers apart (digit runs, the case
# of contractions, newlines after symbols, whitespace runs).
_PROBE = "Hello World's 1234567 DON'T it'S  \n\n  x\t3.14!!\n ÀÉ 日本 😀 ''  end"


def pre_tokenizer_name(metadata: dict) -> str:
    name = metadata.get("tokenizer.ggml.pre")
    name = PRE_TOKENIZER_ALIASES.get(name, name)
    if name not in PRE_TOKENIZERS:
        known = ", ".join(sorted([*PRE_TOKENIZERS, *PRE_TOKENIZER_ALIASES]))
        raise GGUFError(f"GGUF pre-tokenizer {name!r} is not supported (supported: {known})")
    return name


def tokenizer_model(metadata: dict) -> str:
    """"gpt2" (byte-level BPE) or "llama" (SentencePiece), checked; anything else is one clear line."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise GGUFError(f"GGUF tokenizer model {kind!r} is not supported: byte-level BPE ('gpt2': llama-3, "
                        "SmolLM, Qwen2) and SentencePiece ('llama': Gemma, Llama 2, Mistral) are")
    if not metadata.get("tokenizer.ggml.tokens"):
        raise GGUFError("the GGUF file has no tokenizer.ggml.tokens")
    if kind == "gpt2" and "tokenizer.ggml.merges" not in metadata:
        raise GGUFError("the GGUF file has a BPE tokenizer without tokenizer.ggml.merges")
    return kind


def _pre_tokenizer(name: str):
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in PRE_TOKENIZERS[name]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def build_tokenizer(metadata: dict):
    """A `tokenizers.Tokenizer` that encodes and decodes as llama.cpp does with this file."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    if tokenizer_model(metadata) == "llama":
        tokenizer = build_spm_tokenizer(metadata)
        _add_bos_processor(tokenizer, metadata)
        return tokenizer
    pre = pre_tokenizer_name(metadata)
    tokens = metadata["tokenizer.ggml.tokens"]
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in _IGNORE_MERGES))
    tokenizer.pre_tokenizer = _pre_tokenizer(pre)
    tokenizer.decoder = decoders.ByteLevel()
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    tokenizer.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                          for i, kind in enumerate(types) if kind == USER_DEFINED])
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, kind in enumerate(types) if kind == CONTROL])
    _add_bos_processor(tokenizer, metadata)
    return tokenizer


def _add_bos_processor(tokenizer, metadata: dict) -> None:
    from tokenizers import processors

    tokens = metadata["tokenizer.ggml.tokens"]
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    if add_bos(metadata) and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A {tokens[bos]} $B", special_tokens=[(tokens[bos], bos)])


def add_bos(metadata: dict) -> bool:
    # llama.cpp's defaults when the file does not say: SentencePiece adds BOS, BPE only for llama3's split
    default = tokenizer_model(metadata) == "llama" or pre_tokenizer_name(metadata) in _ADD_BOS_DEFAULT
    return bool(metadata.get("tokenizer.ggml.add_bos_token", default))


def tokenizer_config(metadata: dict, context_length: int | None = None) -> dict:
    """tokenizer_config.json: the special tokens and the chat template, for transformers."""
    tokens = metadata["tokenizer.ggml.tokens"]

    def token(key):
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"), "eos_token": token("eos"), "pad_token": token("padding"),
        "unk_token": token("unknown"), "add_bos_token": add_bos(metadata),
        "clean_up_tokenization_spaces": (tokenizer_model(metadata) == "gpt2"
                                         and pre_tokenizer_name(metadata) in _CLEAN_SPACES),
        "model_max_length": context_length or 1_000_000,
    }
    if metadata.get("tokenizer.chat_template"):
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return {k: v for k, v in config.items() if v is not None}


def write_tokenizer(metadata: dict, folder: Path, context_length: int | None = None) -> None:
    build_tokenizer(metadata).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(metadata, context_length), indent=1),
                                                  encoding="utf-8")


# ---------------------------------------------------------------------------
# The other way: a Hugging Face tokenizer as GGUF metadata (for export)


def hf_pre_tokenizer_name(backend) -> str:
    """Which supported llama.cpp pre-tokenizer splits text as this `tokenizers.Tokenizer` does."""
    if backend.pre_tokenizer is not None:
        target = backend.pre_tokenizer.pre_tokenize_str(_PROBE)
        for name in PRE_TOKENIZERS:
            if [p for p, _ in _pre_tokenizer(name).pre_tokenize_str(_PROBE)] == [p for p, _ in target]:
                return name
    raise GGUFError("the model's tokenizer splits text unlike any pre-tokenizer llama.cpp is known to share "
                    f"with it here ({', '.join(PRE_TOKENIZERS)}); it cannot be exported to GGUF")


def metadata_from_hf(tokenizer, vocab_size: int) -> dict:
    """tokenizer.* GGUF metadata of a byte-level BPE Hugging Face tokenizer (an mlx-lm TokenizerWrapper)."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = hf.backend_tokenizer
    model = json.loads(backend.to_str())["model"]
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise GGUFError("only byte-level BPE tokenizers (llama-3, SmolLM, Qwen2 style) can be exported to GGUF")
    vocab = backend.get_vocab(with_added_tokens=True)
    if sorted(vocab.values()) != list(range(len(vocab))) or len(vocab) > vocab_size:
        raise GGUFError(f"the tokenizer's ids are not 0..{len(vocab) - 1} within the model's {vocab_size} rows")
    tokens = sorted(vocab, key=vocab.get) + [f"[PAD{i}]" for i in range(len(vocab), vocab_size)]
    types = [NORMAL] * len(vocab) + [UNUSED] * (vocab_size - len(vocab))
    for index, added in backend.get_added_tokens_decoder().items():
        types[index] = CONTROL if added.special else USER_DEFINED
    probe = hf.encode("a")
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": hf_pre_tokenizer_name(backend),
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])],
        "tokenizer.ggml.add_bos_token": bool(hf.bos_token_id is not None and probe[:1] == [hf.bos_token_id]),
    }
    for key, index in (("bos", hf.bos_token_id), ("eos", tokenizer.eos_token_id), ("padding", hf.pad_token_id),
                       ("unknown", hf.unk_token_id)):
        if index is not None:
            meta[f"tokenizer.ggml.{key}_token_id"] = int(index)
    if getattr(hf, "chat_template", None):
        meta["tokenizer.chat_template"] = hf.chat_template
    return meta
