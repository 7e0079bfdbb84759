"""The tokenizer of a GGUF file, rebuilt as a Hugging Face `tokenizers` tokenizer.

SentencePiece vocabularies (Gemma, Llama 2, Mistral) are built in
gguf_spm.py; this module does byte-level BPE and what both kinds share.
A GGUF file carries its byte-level BPE as lists (tokens, merges, token types)
and names its pre-tokenizer (`tokenizer.ggml.pre`): the regular expressions
that cut text into words before BPE runs on each word. llama.cpp keeps those
expressions in its source, keyed by that name (several names share one
split); the ones below are written to split as llama.cpp does, checked
against it code point by code point. A name not listed is an error, not a
guess: a wrong split gives valid-looking but different token ids, and a model
fed tokens it was not trained on degrades without any message. (deepseek-llm
is left out on purpose: the letter list llama.cpp keeps for it matches only
ASCII and full-width letters in the Linux build tested, unlike the list
itself, so no one split agrees with llama.cpp everywhere.)

Both kinds then follow llama.cpp's other rules: control, unknown and
user-defined tokens are found whole in the text before anything else (and
tokens named like a turn's end count as control, whatever their type); BOS and
EOS are added as the file says, or by llama.cpp's default for its kind and name.
"""

from __future__ import annotations

import json
from pathlib import Path

from .gguf_file import GGUFError
from .gguf_spm import build_spm_tokenizer

# The GPT-2 pattern: contractions, letters, digits, other symbols, whitespace.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"


def _llama3_like(digits: str, letters: str = r"\p{L}") -> str:
    return (
        _CONTRACTIONS
        + rf"|[^\r\n\p{{L}}\p{{N}}]?[{letters}]+|"
        + digits
        + rf"| ?[^\s{letters}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )


def _cased_words(digits: str, suffix: str) -> str:
    """Tekken's and GPT-4o's split: a word is upper-case letters then lower-case ones, or the other way.
    llama.cpp cannot name Lu/Ll, so it reads "upper" as any letter but a-z and "lower" as any letter
    but A-Z (so a non-ASCII letter is both); written here the same way, so the splits agree."""
    upper, lower = r"(?:(?=\p{L})[^a-z])", r"(?:(?=\p{L})[^A-Z])"
    lead = r"[^\r\n\p{L}\p{N}]?"
    return (
        f"{lead}{upper}*{lower}+{suffix}|{lead}{upper}+{lower}*{suffix}|{digits}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )


# DeepSeek's runs of CJK (and other) characters. Not spaces: llama.cpp turns non-ASCII spaces into a
# vertical tab before it runs an expression like this one, so U+3000 never matches there.
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff&&\\S]+"

# tokenizer.ggml.pre -> the splits applied in turn (each cuts the pieces the previous left).
PRE_TOKENIZERS = {
    "gpt-2": [_GPT2],
    "smollm": [r"\p{N}", _GPT2],  # single digits first, then GPT-2's split
    "llama-bpe": [_llama3_like(r"\p{N}{1,3}")],  # runs of up to three digits
    "qwen2": [_llama3_like(r"\p{N}")],  # single digits
    "qwen35": [_llama3_like(r"\p{N}", r"\p{L}\p{M}")],  # and accents count as letters
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"],
    "deepseek-v3": [
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        (
            r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
            r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        ),
    ],
    "tekken": [_cased_words(r"\p{N}", "")],  # Mistral's tiktoken-style BPE (Mistral Nemo)
    "gpt-4o": [_cased_words(r"\p{N}{1,3}", _CONTRACTIONS + "?")],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],  # llama.cpp's fallback
}
# Keys above are the names llama.cpp writes and reads; these other names select the same split in
# llama.cpp (the same expressions under another model's name).
PRE_TOKENIZER_ALIASES = {
    "mpt": "gpt-2",
    "olmo": "gpt-2",
    "jais": "gpt-2",
    "phi-2": "gpt-2",
    "exaone4": "gpt-2",
    "trillion": "gpt-2",
    "mellum": "gpt-2",
    "a.x-4.0": "gpt-2",
    "gigachat": "gpt-2",
    "llama3": "llama-bpe",
    "llama-v3": "llama-bpe",
    "falcon3": "llama-bpe",
    "falcon-h1": "llama-bpe",
    "pixtral": "llama-bpe",
    "midm-2.0": "llama-bpe",
    "lfm2": "llama-bpe",
    "dbrx": "llama-bpe",
    "smaug-bpe": "llama-bpe",
    "starcoder": "smollm",
    "refact": "smollm",
    "command-r": "smollm",
    "codeshell": "smollm",
    "exaone": "smollm",
    "minerva-7b": "smollm",
    "deepseek-r1-qwen": "qwen2",
    "stablelm2": "qwen2",
    "kormo": "qwen2",
    "megrez": "qwen2",
    "hunyuan": "qwen2",
    "grok-2": "qwen2",
    "hunyuan-dense": "deepseek-v3",
    "joyai-llm": "deepseek-v3",
    "llama4": "gpt-4o",
    "minimax-m2": "gpt-4o",
    "kanana2": "gpt-4o",
    "talkie": "gpt-4o",
}
# llama.cpp's settings by the name in the file (names sharing a split may differ here): llama3's and
# tekken's BPE take a word that is in the vocabulary whole before merging, and add BOS by default.
_WHOLE_WORDS = {
    "llama-bpe",
    "llama3",
    "llama-v3",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "tekken",
}
_ADD_BOS_DEFAULT = _WHOLE_WORDS

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 1, 2, 3, 4, 5
# llama.cpp treats tokens of these names as control tokens whatever the file says (they end a turn).
_ENDS_TURN = {
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
    "<|return|>",
    "<|call|>",
}
# Text whose pre-tokenization tells the supported pre-tokenizers apart (digit runs, the case
# of contractions, newlines after symbols, whitespace runs, case changes inside a word, slashes, backticks,
# a combining accent).
_PROBE = (
    "Hello World's 1234567 DON'T it'S  \n\n  x\t3.14!!\n ÀÉ 日本 😀 ''  end camelCase a/b/\n`x`! cafe\u0301"
)


def pre_tokenizer_name(metadata: dict) -> str:
    """The file's pre-tokenizer name as llama.cpp reads it; an unknown (or missing) one is one clear line."""
    name = metadata.get("tokenizer.ggml.pre")
    if name not in PRE_TOKENIZERS and name not in PRE_TOKENIZER_ALIASES:
        known = ", ".join(sorted([*PRE_TOKENIZERS, *PRE_TOKENIZER_ALIASES]))
        what = (
            f"pre-tokenizer {name!r} is not supported"
            if name is not None
            else "file names no pre-tokenizer (tokenizer.ggml.pre: an old conversion, "
            "which llama.cpp splits as 'default' with a warning that output degrades; convert it again)"
        )
        raise GGUFError(f"GGUF {what} (supported: {known})")
    return name


def _split_name(name: str) -> str:
    return PRE_TOKENIZER_ALIASES.get(name, name)


def tokenizer_model(metadata: dict) -> str:
    """ "gpt2" (byte-level BPE) or "llama" (SentencePiece), checked; anything else is one clear line."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise GGUFError(
            f"GGUF tokenizer model {kind!r} is not supported: byte-level BPE ('gpt2': llama-3, "
            "SmolLM, Qwen2) and SentencePiece ('llama': Gemma, Llama 2, Mistral) are"
        )
    if not metadata.get("tokenizer.ggml.tokens"):
        raise GGUFError("the GGUF file has no tokenizer.ggml.tokens")
    if kind == "gpt2" and "tokenizer.ggml.merges" not in metadata:
        raise GGUFError("the GGUF file has a BPE tokenizer without tokenizer.ggml.merges")
    return kind


def _pre_tokenizer(name: str):
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in PRE_TOKENIZERS[name]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def build_tokenizer(metadata: dict):
    """A `tokenizers.Tokenizer` that encodes and decodes as llama.cpp does with this file."""
    from tokenizers import Tokenizer, models

    if tokenizer_model(metadata) == "llama":
        tokenizer = build_spm_tokenizer(metadata)
    else:
        pre = pre_tokenizer_name(metadata)
        vocab = {token: i for i, token in enumerate(metadata["tokenizer.ggml.tokens"])}
        merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in _WHOLE_WORDS))
        tokenizer.pre_tokenizer = _pre_tokenizer(_split_name(pre))
        tokenizer.decoder = _byte_level_decoder(metadata)
    _add_whole_tokens(tokenizer, metadata)
    _add_bos_eos(tokenizer, metadata)
    return tokenizer


def _byte_level_decoder(metadata: dict):
    """Byte-level decoding, where user-defined tokens stay the text they are (as llama.cpp decodes them).
    DeepSeek's vocabularies add the letters whose byte-level meaning is a byte UTF-8 never has (0xC0,
    0xC1, 0xF5-0xFF: "À", "ü", ...) as user-defined tokens, and a byte-level decoder would read "ü" as
    0xFC. Such a token is spelled in byte-level letters before decoding. (A normal token holding one of
    those letters decodes to U+FFFD either way, so this changes nothing else.)"""
    from tokenizers import decoders, pre_tokenizers

    tokens = metadata["tokenizer.ggml.tokens"]
    types = metadata.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    user = [
        t for t, kind in zip(tokens, types) if kind == USER_DEFINED and any(126 < ord(c) < 324 for c in t)
    ]
    if not user:
        return decoders.ByteLevel()
    safe = {chr(b) for b in (0xC0, 0xC1, *range(0xF5, 0x100))}  # letters of bytes UTF-8 never has
    used = {c for t, kind in zip(tokens, types) if kind != USER_DEFINED for c in t} - safe
    spell = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return decoders.Sequence(
        [decoders.Replace(t, spell.pre_tokenize_str(t)[0][0]) for t in user if not used & set(t)]
        + [decoders.ByteLevel()]
    )


def _add_whole_tokens(tokenizer, metadata: dict) -> None:
    """Tokens that llama.cpp finds in the text before anything else (as whole tokens): control and
    unknown ones (which decoding may skip) and user-defined ones (kept as text)."""
    from tokenizers import AddedToken

    tokens = metadata["tokenizer.ggml.tokens"]
    types = metadata.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    # Phi-3's files (llama.cpp goes by the model's name) drop the whitespace after these tokens. (ASCII
    # whitespace only, in llama.cpp; `tokenizers` drops U+00A0 or U+3000 there too.)
    phi3 = any(name in str(metadata.get("general.name", "")).lower() for name in ("phi-3", "phi3"))

    def whole(i, special):
        rstrip = phi3 and tokens[i] not in ("<unk>", "<s>", "<|endoftext|>")
        return AddedToken(tokens[i], special=special, normalized=False, rstrip=rstrip)

    special = [i for i, kind in enumerate(types) if kind in (CONTROL, UNKNOWN) or tokens[i] in _ENDS_TURN]
    tokenizer.add_tokens(
        [
            whole(i, False)
            for i, kind in enumerate(types)
            if kind == USER_DEFINED and tokens[i] not in _ENDS_TURN
        ]
    )
    tokenizer.add_special_tokens([whole(i, True) for i in special])


def _add_bos_eos(tokenizer, metadata: dict) -> None:
    from tokenizers import processors

    tokens = metadata["tokenizer.ggml.tokens"]
    ids = {key: metadata.get(f"tokenizer.ggml.{key}_token_id") for key in ("bos", "eos")}
    first = [tokens[ids["bos"]]] if add_bos(metadata) and ids["bos"] is not None else []
    last = [tokens[ids["eos"]]] if add_eos(metadata) and ids["eos"] is not None else []
    if first or last:
        single = " ".join(first + ["$A"] + last)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=single,
            pair=f"{single} {single.replace('$A', '$B')}",
            special_tokens=[
                (tokens[ids[key]], ids[key]) for key, on in (("bos", first), ("eos", last)) if on
            ],
        )


def add_bos(metadata: dict) -> bool:
    # llama.cpp's defaults when the file does not say: SentencePiece adds BOS, BPE only for llama3's
    # and tekken's names
    default = tokenizer_model(metadata) == "llama" or pre_tokenizer_name(metadata) in _ADD_BOS_DEFAULT
    return bool(metadata.get("tokenizer.ggml.add_bos_token", default))


def add_eos(metadata: dict) -> bool:
    return bool(metadata.get("tokenizer.ggml.add_eos_token", False))


def tokenizer_config(metadata: dict, context_length: int | None = None) -> dict:
    """tokenizer_config.json: the special tokens and the chat template, for transformers."""
    tokens = metadata["tokenizer.ggml.tokens"]

    def token(key):
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "add_bos_token": add_bos(metadata),
        "add_eos_token": add_eos(metadata),
        # Decoded text is the tokens' text, as llama.cpp streams it: no spaces dropped before punctuation
        # (which llama_detokenize does for some names), so that decoding undoes encoding.
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length or 1_000_000,
    }
    if metadata.get("tokenizer.chat_template"):
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return {k: v for k, v in config.items() if v is not None}


def write_tokenizer(metadata: dict, folder: Path, context_length: int | None = None) -> None:
    build_tokenizer(metadata).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(metadata, context_length), indent=1), encoding="utf-8"
    )


# ---------------------------------------------------------------------------
# The other way: a Hugging Face tokenizer as GGUF metadata (for export)


def hf_pre_tokenizer_name(backend) -> str:
    """Which supported llama.cpp pre-tokenizer splits text as this `tokenizers.Tokenizer` does."""
    if backend.pre_tokenizer is not None:
        target = backend.pre_tokenizer.pre_tokenize_str(_PROBE)
        for name in PRE_TOKENIZERS:
            if [p for p, _ in _pre_tokenizer(name).pre_tokenize_str(_PROBE)] == [p for p, _ in target]:
                return name
    raise GGUFError(
        "the model's tokenizer splits text unlike any pre-tokenizer llama.cpp is known to share "
        f"with it here ({', '.join(PRE_TOKENIZERS)}); it cannot be exported to GGUF"
    )


def metadata_from_hf(tokenizer, vocab_size: int) -> dict:
    """tokenizer.* GGUF metadata of a byte-level BPE Hugging Face tokenizer (an mlx-lm TokenizerWrapper)."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = hf.backend_tokenizer
    model = json.loads(backend.to_str())["model"]
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise GGUFError(
            "only byte-level BPE tokenizers (llama-3, SmolLM, Qwen2 style) can be exported to GGUF"
        )
    vocab = backend.get_vocab(with_added_tokens=True)
    if sorted(vocab.values()) != list(range(len(vocab))) or len(vocab) > vocab_size:
        raise GGUFError(
            f"the tokenizer's ids are not 0..{len(vocab) - 1} within the model's {vocab_size} rows"
        )
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
    for key, index in (
        ("bos", hf.bos_token_id),
        ("eos", tokenizer.eos_token_id),
        ("padding", hf.pad_token_id),
        ("unknown", hf.unk_token_id),
    ):
        if index is not None:
            meta[f"tokenizer.ggml.{key}_token_id"] = int(index)
    if getattr(hf, "chat_template", None):
        meta["tokenizer.chat_template"] = hf.chat_template
    return meta
