"""Episodes keep their keys and values between turns (the fixed-shape decoder's buffers).

After a turn, each row of the batch holds its episode's context in slots
[left_padding, end): the prompt, the earlier turns and observations, and the
model's turn up to its last sampled token (that one was never fed, so it has
no keys or values yet). The next turn must feed only what is new: that last
token, the observation joined through the chat template, and the next
assistant header (`chunk`).

Two steps do it:

- `appended` moves the live rows into new buffers, each row shifted right so
  that its context ends where its chunk begins, and all chunks end at one slot
  (`start`), where the decode's first step feeds each chunk's last token.
  Finished rows are left behind, and the buffers grow by the turn's tokens.
  It goes one layer at a time, so the peak is the buffers plus one layer.
- `prefill` runs the chunks (minus their last token) through the model as
  one batch: row r's chunk is right-aligned in a block of columns ending at
  `start`. The columns before a shorter chunk are that row's own context, so
  the block's keys and values are written only where the row has a chunk
  token (the others keep what is there). A token at slot s sees slots
  [left_padding, s] of its row, at RoPE position s - left_padding: exactly
  what a full forward pass over the whole episode computes there. Rows come
  longest chunk first and the columns go in slices, each over only the rows
  with tokens in it, so a long observation in one row does not make every
  row compute that many columns.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import mlx.core as mx
import numpy as np

from ..models import cpu_math
from ..models.heads import output_head
from ..device import on_cpu
from .fixed_decode import Rows, buffer_length

# Columns of a chunk run at once: the attention scores of a block are rows x
# heads x columns x buffer length, so long blocks go in slices of about this many
# (rows x columns x length) elements.
_BLOCK_ELEMENTS = 1 << 20


def appended(
    pieces: list[tuple[list[int], Rows]],
    ends: list[int],
    rows: list[int],
    chunks: list[list[int]],
    max_tokens: int,
) -> tuple[Rows, int]:
    """New buffers for `rows` (indices of the previous batch), with room for their chunks and max_tokens more.

    `pieces` are the previous decode's buffers (fixed_decode.Decoded.pieces),
    consumed here; ends[r] is previous row r's end slot. Returns the buffers
    and `start`, the slot where each chunk's last token goes.
    """
    where = {}
    offset = 0
    for ids, piece in pieces:
        for i, r in enumerate(ids):
            where[r] = (offset + i, piece.left_padding[i])
        offset += len(ids)
    old_padding = np.array([where[r][1] for r in rows])
    content = np.array([ends[r] for r in rows]) - old_padding
    fresh = np.array([len(c) - 1 for c in chunks])
    start = int((content + fresh).max())
    length = buffer_length(start + max_tokens)
    left_padding = start - fresh - content
    held = [piece.take() for _, piece in pieces]
    _, heads, old_length, _ = held[0][0][0].shape
    # New slot s of row i holds old slot s - shift[i] of its source row (clipped slots are masked
    # anyway): one gather over the buffer seen as (rows x heads x slots, head_dim).
    slots = np.clip(np.arange(length)[None] - (left_padding - old_padding)[:, None], 0, old_length - 1)
    source = np.array([where[r][0] for r in rows])
    flat = (source[:, None, None] * heads + np.arange(heads)[None, :, None]) * old_length + slots[:, None, :]
    index = mx.array(flat.reshape(-1).astype(np.int32))
    keys, values = [], []
    for layer in range(len(held[0][0])):
        for part, out in ((0, keys), (1, values)):
            parts = [h[part][layer] for h in held]
            whole = parts[0] if len(parts) == 1 else mx.concatenate(parts)
            dim = whole.shape[-1]
            out.append(mx.take(whole.reshape(-1, dim), index, axis=0).reshape(len(rows), heads, length, dim))
            del parts, whole
            mx.eval(out[-1])
            for h in held:
                h[part][layer] = None
    return Rows(keys, values, [int(p) for p in left_padding]), start


class _AppendCache:
    """One layer's buffers while a block of chunk columns runs over the first `n` rows.

    The block's keys and values are written where a row has a chunk token;
    elsewhere the slots keep what they hold (the row's own context).
    """

    def __init__(self, keys, values, n: int, first: int, positions, real, visible, old):
        self.keys, self.values = keys, values
        self.n = n
        self.start = mx.array([0, first])
        self.offset = positions  # RoPE: each row's position of the block's first column
        self.real = real
        self.visible = visible
        self.old = old

    def update_and_fetch(self, keys, values):
        keys = mx.where(self.real, keys, self.old[0])
        values = mx.where(self.real, values, self.old[1])
        self.old = None
        self.keys = mx.slice_update(self.keys, keys, self.start, axes=(0, 2))
        self.values = mx.slice_update(self.values, values, self.start, axes=(0, 2))
        return self.keys[: self.n], self.values[: self.n]

    def make_mask(self, n, return_array=False, window_size=None):
        return self.visible


# Scores a piece of the CPU attention below may hold (rows x heads x columns x slots).
_PIECE_ELEMENTS = 1 << 19


@mx.compile
def _softmax_numerators(scores, row_max, visible):
    return mx.where(visible, cpu_math.polynomial_exp(scores - row_max), 0.0)


def _attention_in_pieces(queries, keys, values, scale, visible):
    """Masked attention of a block on MLX's CPU: a few rows at a time, with cpu_math's exp.

    MLX's CPU attention takes libm's exp (12 ns a score) over every key slot of
    every column: for a block of 32 rows x 9 heads x 25 columns x 1,152 slots,
    twice the time of its matmuls. The polynomial exp takes 2-4 ns while its
    temporaries stay small (fresh pages fault beyond a few MB), hence the pieces.
    """
    rows, heads, columns, dim = queries.shape
    kv_heads, slots = keys.shape[1], keys.shape[2]
    repeat = heads // kv_heads
    step = max(1, _PIECE_ELEMENTS // (heads * columns * slots))
    out = []
    for a in range(0, rows, step):
        b = min(rows, a + step)
        q = (queries[a:b] * scale).reshape(b - a, kv_heads, repeat * columns, dim)
        scores = (q @ keys[a:b].swapaxes(-1, -2)).reshape(b - a, kv_heads, repeat, columns, slots)
        seen = visible[a:b, :, None]
        row_max = mx.where(seen, scores, -mx.inf).max(axis=-1, keepdims=True)
        weights = _softmax_numerators(scores, row_max, seen)
        mixed = weights.reshape(b - a, kv_heads, repeat * columns, slots) @ values[a:b]
        out.append(
            (mixed / weights.sum(axis=-1).reshape(b - a, kv_heads, repeat * columns, 1))
            .astype(queries.dtype)
            .reshape(b - a, heads, columns, dim)
        )
    return mx.concatenate(out) if len(out) > 1 else out[0]


@contextmanager
def _cpu_attention(model):
    """While a block runs on the CPU, the model's attention layers call _attention_in_pieces for it."""
    if not on_cpu():
        yield
        return
    modules = {
        sys.modules[type(m).__module__]
        for _, m in model.named_modules()
        if getattr(sys.modules.get(type(m).__module__), "scaled_dot_product_attention", None) is not None
    }
    originals = {m: m.scaled_dot_product_attention for m in modules}

    def wrapped(original):
        def attention(queries, keys, values, cache=None, scale=1.0, mask=None, sinks=None):
            if isinstance(cache, _AppendCache) and sinks is None and isinstance(mask, mx.array):
                return _attention_in_pieces(queries, keys, values, scale, mask)
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

        return attention

    try:
        for module, original in originals.items():
            module.scaled_dot_product_attention = wrapped(original)
        yield
    finally:
        for module, original in originals.items():
            module.scaled_dot_product_attention = original


def prefill(model, rows: Rows, start: int, chunks: list[list[int]]) -> int:
    """Write the keys and values of each chunk minus its last token into slots ending at `start`.

    The chunks must come longest first: a block of columns then runs over the
    rows that have tokens in it, which are the first ones. Returns the number
    of tokens prefilled.
    """
    fresh = np.array([len(c) - 1 for c in chunks])
    if np.any(np.diff(fresh) > 0):
        raise ValueError("prefill wants the chunks longest first")
    width = int(fresh.max())
    if width == 0:
        return 0
    forward = model.model if output_head(model) is not None else model  # keys and values only
    tokens = np.zeros((len(chunks), width), dtype=np.int32)
    for r, chunk in enumerate(chunks):
        if fresh[r]:
            tokens[r, width - fresh[r] :] = chunk[:-1]
    left_padding = np.array(rows.left_padding)
    keys, values = rows.take()
    length = keys[0].shape[2]
    step = int(np.clip(_BLOCK_ELEMENTS // max(1, len(chunks) * length), 8, 64))
    slots = mx.arange(length)
    for a in range(0, width, step):
        b = min(width, a + step)
        n = int((fresh > width - b).sum())  # rows with a chunk token in columns [a, b)
        real = np.arange(a, b)[None] >= (width - fresh[:n])[:, None]
        first = start - width + a  # the slot of column a
        query = mx.arange(first, first + b - a)
        padding = mx.array(left_padding[:n])
        visible = (
            (slots[None, None] >= padding[:, None, None]) & (slots[None, None] <= query[None, :, None])
            | (slots[None, None] == query[None, :, None])
        )[:, None]  # a column always sees itself
        old = [(mx.take(k[:n], query, axis=2), mx.take(v[:n], query, axis=2)) for k, v in zip(keys, values)]
        mx.eval(old)
        caches = [
            _AppendCache(
                k,
                v,
                n,
                first,
                mx.array(first - left_padding[:n], dtype=mx.int32),
                mx.array(real)[:, None, :, None],
                visible,
                o,
            )
            for k, v, o in zip(keys, values, old)
        ]
        del keys, values, old  # the caches hold the only references: the writes go in place
        with _cpu_attention(model):
            forward(mx.array(tokens[:n, a:b]), cache=caches)
        keys, values = [c.keys for c in caches], [c.values for c in caches]
        del caches
        mx.eval(keys, values)
    rows.keys, rows.values = keys, values
    return int(fresh.sum())
