"""SentencePiece vocabularies of GGUF files (`tokenizer.ggml.model = "llama"`: Gemma, Llama 2, Mistral).

llama.cpp tokenizes these with SentencePiece's BPE: the text (spaces written
as "▁", after a leading "▁" when the file says add_space_prefix) starts as
one symbol per character; the adjacent pair whose joined text is the
highest-scoring piece of the vocabulary is merged, again and again; a
character that no piece covers falls back to its UTF-8 bytes (<0x..> pieces).

A Hugging Face BPE does the same when its merge list is every pair of pieces
that joins into a piece, ranked by that piece's score (best first), with
byte fallback on: this module builds that. Control tokens (<bos>,
<start_of_turn>) and user-defined ones (Gemma's runs of newlines and tabs,
its HTML tags) are matched whole before the merges, as llama.cpp does
(gguf_tokenizer.py adds them, for both kinds of vocabulary).
"""

from __future__ import annotations

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # "▁", SentencePiece's visible space


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Every (left, right) pair of pieces whose joined text is a normal piece, best-scoring piece first."""
    pieces = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED, BYTE, UNUSED)}
    found = []
    for token, index in pieces.items():
        if types[index] != NORMAL or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in pieces and right in pieces:
                # SentencePiece breaks ties by position; a fixed order (shorter left part first) keeps the
                # list deterministic.
                found.append((-scores[index], index, cut, left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def build_spm_tokenizer(metadata: dict):
    """A `tokenizers.Tokenizer` that encodes and decodes a GGUF SentencePiece vocabulary as llama.cpp does."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    tokens = metadata["tokenizer.ggml.tokens"]
    types = metadata.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    scores = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {token: i for i, token in enumerate(tokens)}
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    model = models.BPE(
        vocab=vocab,
        merges=spm_merges(tokens, scores, types),
        byte_fallback=True,
        fuse_unk=True,
        unk_token=tokens[unk] if unk is not None else None,
    )
    tokenizer = Tokenizer(model)
    space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend(SPACE)] if space_prefix else []
    tokenizer.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPACE)])
    tokenizer.pre_tokenizer = None
    undo = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(undo + ([decoders.Strip(" ", 1, 0)] if space_prefix else []))
    return tokenizer  # gguf_tokenizer.py adds the tokens matched whole, and BOS
