"""How many sequences decode at once: the setting's cap, and what a memory budget allows.

One rule for every rollout (single-turn groups, multi-turn episodes) on every
backend. A row of the decode batch holds keys and values for each position it
may reach: its prompt plus max_tokens, or for an episode its first prompt plus
max_episode_tokens. So the width is

    min(decode_concurrency, budget // (row positions x key/value bytes a position))

and sequences beyond it go in later waves. The budget is a quarter of the
memory free when the rollout starts (Linux: MemAvailable; Metal: the
recommended working set; CUDA: the device's memory), less what MLX already
holds on a GPU, or `MLX_GRPO_DECODE_MEMORY_GB` gigabytes when set. A rollout's
peak stays within about 1.3x its buffers (turn_cache.py, fixed_decode.py), so a
quarter leaves the rest for the weights, the update and everything else. The
same budget bounds what an update's pass keeps for its backward pass before its
layers are recomputed instead (update/recompute.py).
"""

from __future__ import annotations

import os
import weakref

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..device import on_cpu
from ..models.heads import output_head
from ..models.quantized import available_memory
from .fixed_decode import buffer_length

ENV = "MLX_GRPO_DECODE_MEMORY_GB"
FRACTION = 0.25
_FALLBACK = 4 << 30  # when nothing says how much memory there is

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


def memory_budget() -> int:
    """Bytes the decode's key/value buffers may take (see the module docstring)."""
    chosen = os.environ.get(ENV, "").strip()
    if chosen:
        try:
            return max(1, int(float(chosen) * 1e9))
        except ValueError:
            raise ValueError(f"{ENV} must be a number of gigabytes, got {chosen!r}") from None
    if on_cpu():
        free = available_memory() or _FALLBACK / FRACTION
    else:
        info = mx.device_info()
        total = (
            info.get("max_recommended_working_set_size") or info.get("memory_size") or _FALLBACK / FRACTION
        )
        free = max(0, total - mx.get_active_memory())
    return int(free * FRACTION)


def decode_width(model, row_positions: int, concurrency: int, budget: int | None = None) -> int:
    """Rows to decode at once: at most `concurrency`, and as many as the budget holds (at least 1)."""
    per_row = kv_bytes_per_token(model) * buffer_length(max(1, row_positions))
    if per_row == 0:
        return max(1, concurrency)
    budget = memory_budget() if budget is None else budget
    return max(1, min(concurrency, budget // per_row))
