"""Tokens whose output-head row many others share are found, and demonstrations spell them in ordinary
tokens."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from transformers import AutoTokenizer

from mlx_grpo.models.loading import embedded_model_path
from mlx_grpo.models.untrained_tokens import encode_spelled, indistinct_tokens

WIDTH = 16


@pytest.fixture()
def tokenizer():
    folder = embedded_model_path()
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the embedded model's tokenizer is not built")
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.add_tokens(["<tool_call>", "</tool_call>", "<ok>"])  # written in text, not special
    tok.add_special_tokens({"additional_special_tokens": ["<|marker|>"]})
    return tok


class _Model(nn.Module):
    """The two parts `output_head` reads: a plain-head model type and its lm_head."""

    def __init__(self, head_rows: np.ndarray):
        super().__init__()
        self.model_type = "qwen2"
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(head_rows.shape[0], WIDTH)
        self.lm_head = nn.Linear(WIDTH, head_rows.shape[0], bias=False)
        self.lm_head.weight = mx.array(head_rows)


def _head(tokenizer, shared: list[int]) -> np.ndarray:
    """Random distinct rows, except that `shared` and ten ordinary tokens all hold one row (as a scale
    differs)."""
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(len(tokenizer), WIDTH)).astype(np.float32)
    drifted = rng.normal(size=WIDTH).astype(np.float32)
    for i, token in enumerate([*shared, *range(10, 20)]):
        rows[token] = drifted * (1.0 + 0.1 * i)  # the same direction: the rows differ by a scale only
    return rows


def test_text_tokens_sharing_a_row_with_many_tokens_are_found(tokenizer):
    call, end, ok, marker = (
        tokenizer.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>", "<ok>", "<|marker|>")
    )
    found = indistinct_tokens(_Model(_head(tokenizer, [call, end, marker])), tokenizer)
    # <ok> has a row of its own; the special marker is the template's, never in a demonstration's text
    assert found == {call: "<tool_call>", end: "</tool_call>"}


def test_a_row_shared_by_a_few_tokens_is_not_flagged(tokenizer):
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    rows = _head(tokenizer, [])
    rows[call] = rows[3] = rows[4]  # three tokens alike: fewer twins than MIN_TWINS
    assert indistinct_tokens(_Model(rows), tokenizer) == {}


def test_spelled_text_decodes_the_same_without_the_added_token(tokenizer):
    call, end = (
        tokenizer.convert_tokens_to_ids("<tool_call>"),
        tokenizer.convert_tokens_to_ids("</tool_call>"),
    )
    text = '<tool_call>\n{"name": "read"}\n</tool_call> then <tool_call>x</tool_call>'
    plain = tokenizer.encode(text, add_special_tokens=False)
    assert plain.count(call) == 2  # the tokenizer's own encoding uses the added tokens
    ids = encode_spelled(tokenizer, text, {call: "<tool_call>", end: "</tool_call>"})
    assert call not in ids and end not in ids and tokenizer.decode(ids) == text
    # nothing to spell: exactly the tokenizer's encoding
    assert encode_spelled(tokenizer, text, {}) == plain
