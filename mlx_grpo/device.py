"""Whether MLX computes on the CPU: the one place the project asks.

Several choices hang on it (preloading a real BLAS, the float32 copy of a quantized base, the
activation budget of a micro-batch, the decode's memory, the CPU's own exp and swiglu), and they
must all agree on what "the CPU" means.
"""

from __future__ import annotations


def on_cpu() -> bool:
    # Imported here, not above: blas.py asks before it decides whether to re-execute the process
    # with OpenBLAS preloaded, and importing this module must not load MLX on its own.
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.cpu
