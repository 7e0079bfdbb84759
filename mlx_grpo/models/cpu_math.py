"""exp, log-sum-exp and SwiGLU for MLX's CPU backend, 3-6x faster there than MLX's own.

Why: MLX's x86-64 CPU wheel is built for baseline x86-64, so its exp (a degree-6
polynomial in 2^f, with fma) calls libm's `fmaf` out of line at every step of the
polynomial: 12-16 ns an element on this project's CI machine, where a multiply
costs well under one. Each sampled token needs a log-normaliser over the whole
vocabulary (16 rows x 49,152 logits: 12 ms), and every MLP a SiLU, so an exp, per
intermediate unit and position. In a SmolLM2 decode step of 16 rows those were
about a quarter of the step.

The same polynomial written with plain multiplies and adds, compiled, takes
2-4 ns an element, with a relative error under 1.2e-7 (MLX's own exp is of the
same order). The update keeps MLX's exp for its (rows, positions, vocabulary)
softmax: there the polynomial's intermediates (the bit trick below is not fused
with the rest) raise the update's peak memory by several logits-sized arrays.
Measured in the frozen head's softmax at 0.5B (scripts/profile_update.py): 4-5%
off the update for 0.39 GB more peak (3.38 -> 3.77 GB), not kept. On the GPU
backends exp is a hardware instruction, so there these functions are MLX's own
ops; the choice is made when a function is traced.

Inputs from -87 down (and -inf) give exp(-87) = 1.6e-38 instead of a smaller
number or 0; inputs above 88 give exp(88) instead of inf. NaN stays NaN.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu as mlx_lm_swiglu

from ..device import on_cpu

# exp(x) = 2^t with t = x log2(e), split as 2^n * 2^f, n an integer and
# f in [-0.5, 0.5); 2^f by these Horner coefficients (highest power first).
_POW2_COEFFICIENTS = (
    1.535336188319500e-4,
    1.339887440266574e-3,
    9.618437357674640e-3,
    5.550332471162809e-2,
    2.402264791363012e-1,
    6.931472028550421e-1,
    1.0,
)
_LOG2_E = 1.4426950408889634


# Compiled for each new shape (a view cannot be traced shapeless); the kernels
# themselves are shared between shapes.
@mx.compile
def polynomial_exp(x: mx.array) -> mx.array:
    t = mx.clip(x.astype(mx.float32), -87.0, 88.0) * _LOG2_E
    # t + 127.5 > 0, so truncation is floor(t + 0.5) + 127: the biased exponent of 2^n.
    biased = (t + 127.5).astype(mx.int32)
    f = t - (biased.astype(mx.float32) - 127.0)
    power = _POW2_COEFFICIENTS[0]
    for c in _POW2_COEFFICIENTS[1:]:
        power = power * f + c
    two_to_n = mx.view(mx.left_shift(biased, 23), mx.float32)  # the float with that exponent and no mantissa
    return (power * two_to_n).astype(x.dtype)


@mx.custom_function
def _exp_with_gradient(x):
    return polynomial_exp(x)


@_exp_with_gradient.vjp
def _exp_vjp(primals, cotangent, output):
    return cotangent * output


def exp(x: mx.array) -> mx.array:
    """e^x elementwise (see the module docstring for the range)."""
    return _exp_with_gradient(x) if on_cpu() else mx.exp(x)


def logsumexp(x: mx.array, axis: int = -1, keepdims: bool = False) -> mx.array:
    """log(sum(exp(x))) along `axis`, as mx.logsumexp (not for rows that are all -inf)."""
    if not on_cpu():
        return mx.logsumexp(x, axis=axis, keepdims=keepdims)
    shift = mx.stop_gradient(mx.max(x, axis=axis, keepdims=True))
    total = mx.log(exp(x - shift).sum(axis=axis, keepdims=True)) + shift
    return total if keepdims else total.squeeze(axis)


def _sigmoid(x):
    return 1 / (1 + polynomial_exp(-x))


@mx.custom_function
def _silu(x):
    return (x * _sigmoid(x.astype(mx.float32))).astype(x.dtype)


@_silu.vjp
def _silu_vjp(x, cotangent, output):
    # d/dx x s(x) = s (1 + x (1 - s)); s is recomputed rather than kept, so the
    # backward pass holds no more than MLX's own SiLU does.
    x32 = x.astype(mx.float32)
    s = _sigmoid(x32)
    return (cotangent * (s * (1 + x32 * (1 - s)))).astype(x.dtype)


@mx.compile
def _cpu_swiglu(gate, x):
    return _silu(gate) * x


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x, as mlx-lm's `swiglu` (which it is, off the CPU)."""
    return _cpu_swiglu(gate, x) if on_cpu() else mlx_lm_swiglu(gate, x)


def _plain_swiglu_mlps() -> tuple[type, ...]:
    """mlx-lm MLP classes whose __call__ is exactly down_proj(swiglu(gate_proj(x), up_proj(x)))."""
    from mlx_lm.models import llama, olmo2, qwen2, qwen3

    return llama.MLP, olmo2.MLP, qwen2.MLP, qwen3.MLP


class _SwiGLUCall:
    def __call__(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


_fast_classes: dict[type, type] = {}


def use_fast_swiglu(model: nn.Module) -> int:
    """Make each plain SwiGLU MLP of `model` call `swiglu` above; returns how many.

    Only the instance's class changes (to a subclass with the same name and
    weights), so parameter names, adapters and saved files are untouched, and
    other models of the same class in the process keep mlx-lm's code.
    """
    plain = _plain_swiglu_mlps()
    changed = 0
    for _, module in model.named_modules():
        cls = type(module)
        if cls in plain:
            if cls not in _fast_classes:
                _fast_classes[cls] = type(cls.__name__, (_SwiGLUCall, cls), {"__module__": __name__})
            module.__class__ = _fast_classes[cls]
            changed += 1
    return changed
