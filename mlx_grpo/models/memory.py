"""The memory budget of one large temporary: a decode's key/value buffers, or what an update's pass keeps.

A quarter of the memory free when it is asked (Linux: MemAvailable; Metal: the recommended
working set; CUDA: the device's memory), less what MLX already holds on a GPU, or
`MLX_GRPO_DECODE_MEMORY_GB` gigabytes when set. The decode's width (sampling/width.py) and the
update's choice to recompute its layers (update/recompute.py) both read it, so one setting
bounds both.
"""

from __future__ import annotations

import os

import mlx.core as mx

from ..device import on_cpu
from .quantized import available_memory

ENV = "MLX_GRPO_DECODE_MEMORY_GB"
FRACTION = 0.25
_FALLBACK = 4 << 30  # when nothing says how much memory there is


def memory_budget() -> int:
    """Bytes the temporary may take (see the module docstring)."""
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
