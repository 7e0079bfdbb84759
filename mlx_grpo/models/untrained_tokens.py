"""Tokens a model cannot write apart from many others: their rows in its output head are one shared vector.

A token its pretraining almost never produced keeps the row every such token drifted to. In
Qwen2.5-Coder-0.5B-Instruct `<tool_call>` and `</tool_call>` have exactly the row of its padding ids
and of hundreds of rare tokens: an update that raises the logit of `<tool_call>` raises all of them
alike, and the model then samples any one (" nieruch", "[PAD151876]") where the call should open. No
adapter on the layers can change that. A demonstration that holds such a token therefore spells its
text out in ordinary tokens: the same text, which the parser reads the same and the model can learn.
"""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np

from .heads import output_head

PROBES = 128  # random directions the head's rows are compared along
MIN_TWINS = 8  # a row shared with at least this many other tokens cannot be told apart
SAME_ROW = 0.999  # cosine of two rows' projections above which they count as one row (Qwen's: > 0.9999)


def text_tokens(tokenizer) -> dict[int, str]:
    """{id: text} of the added tokens written inside text (`<tool_call>`), not the template's special
    markers."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {i: token.content for i, token in decoder.items() if not token.special}


def indistinct_tokens(model, tokenizer) -> dict[int, str]:
    """{id: text} of the text tokens (`text_tokens`) whose output-head row at least MIN_TWINS other tokens
    share.

    The rows are compared through the head itself (quantized, tied or adapted alike), by their
    projections on PROBES random unit directions: one row shared by many tokens projects alike."""
    head = output_head(model)
    candidates = text_tokens(tokenizer)
    if head is None or not candidates:
        return {}
    _, project = head
    width = model.model.embed_tokens(mx.array([0])).shape[-1]
    probes = mx.random.normal((PROBES, width), key=mx.random.key(0))
    rows = np.array(project(probes / mx.linalg.norm(probes, axis=-1, keepdims=True)).astype(mx.float32)).T
    rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    found = {}
    for token_id, text in candidates.items():
        if token_id < rows.shape[0] and int((rows @ rows[token_id] > SAME_ROW).sum()) - 1 >= MIN_TWINS:
            found[token_id] = text
    return found


def encode_spelled(tokenizer, text: str, spelled: dict[int, str]) -> list[int]:
    """`text` as token ids, each `spelled` token's text written in ordinary tokens rather than as that token.

    Each occurrence is encoded as its first character, then the rest: neither piece holds the whole
    added token, so the tokenizer spells it; decoding gives `text` back."""
    words = set(spelled.values())
    if not words:
        return list(tokenizer.encode(text, add_special_tokens=False))
    cut = "(" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + ")"
    ids: list[int] = []
    for piece in re.split(cut, text):  # the words themselves are kept, between the text around them
        parts = [piece[0], piece[1:]] if piece in words else [piece]
        for part in filter(None, parts):
            ids += tokenizer.encode(part, add_special_tokens=False)
    return ids
