"""A workaround for MLX's CUDA backend, applied to every policy `load_policy` returns.

On CUDA (MLX 0.32.4), `mx.fast.rope` fails to launch ("invalid argument") for a
single position when fewer than 32 dimensions rotate and rows x ceil(heads / 4)
reaches 128: its launch helper sizes the thread block by powers of two up to
1024 threads and gives the block a z extent of 128, where CUDA allows 64.
Cached batched decoding of a model with a small head (the embedded tiny model
has head dim 16) at 128 rows or more hits it. docs/gpu-crash-repro.md has the
standalone reproduction.

The wrapper rotates at most `rows_per_launch` rows per kernel in exactly that
case, so the decode keeps its width, results are the same, and every other
shape (and every other backend) runs the kernel as before.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

# Rotated dimensions from which the launch helper spends enough threads on the
# x extent (dims / 2 >= 16) that z stays within CUDA's limit of 64.
_SAFE_ROPE_DIMS = 32


def rows_per_launch(x: mx.array) -> int:
    """Most rows of a one-position input that keep rows x ceil(heads / 4) under 128."""
    heads = 1
    for n in x.shape[1:-2]:
        heads *= n
    return max(1, 127 // -(-heads // 4))


class RowChunkedRoPE(nn.Module):
    """Applies `rope` to at most `rows_per_launch` rows at a time when a call has one position."""

    def __init__(self, rope: nn.Module):
        super().__init__()
        self.rope = rope

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        rows = rows_per_launch(x)
        if x.shape[-2] != 1 or x.shape[0] <= rows:
            return self.rope(x, offset=offset)
        per_row = isinstance(offset, mx.array) and offset.ndim > 0
        return mx.concatenate(
            [
                self.rope(x[start : start + rows], offset=offset[start : start + rows] if per_row else offset)
                for start in range(0, x.shape[0], rows)
            ]
        )


def on_cuda() -> bool:
    return mx.default_device() == mx.gpu and mx.cuda.is_available()


def wrap_small_ropes(model: nn.Module) -> int:
    """Wrap each RoPE layer rotating fewer than 32 dimensions; returns how many were wrapped."""
    wrapped = 0
    for _, module in model.named_modules():
        if isinstance(module, RowChunkedRoPE):
            continue
        for name, child in list(module.items()):
            is_rope = isinstance(child, nn.Module) and "RoPE" in type(child).__name__
            if (
                is_rope
                and not isinstance(child, RowChunkedRoPE)
                and getattr(child, "dims", 0) < _SAFE_ROPE_DIMS
            ):
                module[name] = RowChunkedRoPE(child)
                wrapped += 1
    return wrapped


def apply_cuda_fixes(model: nn.Module) -> nn.Module:
    """The workarounds above, on the CUDA backend only (elsewhere the model is returned untouched)."""
    if on_cuda():
        wrap_small_ropes(model)
    return model
