"""How many sequences decode at once: the setting's cap, and what a memory budget allows.

One rule for every rollout (single-turn groups, multi-turn episodes) on every
backend. A row of the decode batch holds keys and values for each position it
may reach: its prompt plus max_tokens, or for an episode its first prompt plus
max_episode_tokens. So the width is

    min(decode_concurrency, budget // (row positions x key/value bytes a position))

and sequences beyond it go in later waves. The budget is a quarter of the
memory free when the rollout starts, or `MLX_GRPO_DECODE_MEMORY_GB` gigabytes
when set (models/memory.py). A rollout's peak stays within about 1.3x its
buffers (turn_cache.py, fixed_decode.py), so a quarter leaves the rest for the
weights, the update and everything else. The same budget bounds what an
update's pass keeps for its backward pass before its layers are recomputed
instead (update/recompute.py).
"""

from __future__ import annotations

import weakref

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..models.heads import output_head
from ..models.memory import memory_budget
from .fixed_decode import buffer_length

_per_token: dict[int, tuple] = {}  # id(model) -> (weak reference, bytes)


def kv_bytes_per_token(model) -> int:
    """Key and value bytes one position of one row takes, over all layers (one probe token, remembered)."""
    hit = _per_token.get(id(model))
    if hit is not None and hit[0]() is model:
        return hit[1]
    cache = make_prompt_cache(model)
    forward = model.model if output_head(model) is not None else model
    forward(mx.array([[0]]), cache=cache)
    total = 0
    for layer in cache:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if (
            isinstance(keys, mx.array) and keys.ndim == 4
        ):  # (1, heads, positions, head_dim); others keep no positions
            total += keys[:, :, :1].nbytes + values[:, :, :1].nbytes
    _per_token[id(model)] = (weakref.ref(model), total)
    return total


def decode_width(model, row_positions: int, concurrency: int, budget: int | None = None) -> int:
    """Rows to decode at once: at most `concurrency`, and as many as the budget holds (at least 1)."""
    per_row = kv_bytes_per_token(model) * buffer_length(max(1, row_positions))
    if per_row == 0:
        return max(1, concurrency)
    budget = memory_budget() if budget is None else budget
    return max(1, min(concurrency, budget // per_row))
