"""Quantized bases (QLoRA): train LoRA adapters on a 4- or 8-bit model.

The quantized weights are frozen and stay as they are; only the adapters
learn, and they save in mlx-lm's format, so `mlx_lm.generate --adapter-path`
applies them to the quantized model unchanged.

On the CPU backend MLX's quantized matmul is slow (SmolLM2-135M sampled 6
tok/s kept 4-bit against 90-121 tok/s in float32 on 2 cores), so there the
base is dequantised into a float32 copy by default, when that copy fits in
memory. The copy holds exactly the values the quantized weights stand for
(`mx.dequantize`), so the adapters suit the quantized model too; what the
difference costs is measured by scripts/bench_quantized.py. `keep_quantized` keeps the
base quantized on the CPU; on Metal and CUDA it always stays quantized.
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.utils import dequantize_model

from ..device import on_cpu

# The float32 copy must leave room for activations, gradients and the optimizer:
# it is made only when it takes at most this share of the memory available.
MEMORY_SHARE = 0.5


def quantized_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every quantized layer (linear, embedding, mixture-of-experts)."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if hasattr(m, "scales") and hasattr(m, "bits") and hasattr(m, "group_size")
    ]


def describe_bits(model: nn.Module) -> str:
    """The quantization of a model in words: "4-bit", or "4/8-bit" when layers differ."""
    return "/".join(str(b) for b in sorted({m.bits for _, m in quantized_modules(model)})) + "-bit"


def float32_bytes(model: nn.Module) -> int:
    """Bytes the model's weights would take in float32, once every quantized layer is dequantised."""
    total = 0
    bits = {name: m.bits for name, m in quantized_modules(model)}
    for name, value in tree_flatten(model.parameters()):
        module, _, leaf = name.rpartition(".")
        if module in bits and leaf in ("scales", "biases"):
            continue  # folded into the dequantised weight
        if module in bits and leaf == "weight":
            total += value.size * (32 // bits[module]) * 4  # each uint32 packs 32 // bits weights
        else:
            total += value.size * 4
    return total


def available_memory() -> int | None:
    """Bytes of memory available now (Linux: MemAvailable; elsewhere: the physical memory), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def dequantize_to_float32(model: nn.Module) -> None:
    """Replace every quantized layer by a float32 one holding its dequantised weights (in place)."""
    # Scales and biases in float32 first: mx.dequantize computes in their dtype, and a float16
    # scale times an 8-bit level (a GGUF Q8_0 block) needs more bits than float16 has.
    for _, module in quantized_modules(model):
        module.update(
            {
                k: v.astype(mx.float32)
                for k, v in module.parameters().items()
                if k in ("scales", "biases") and isinstance(v, mx.array)
            }
        )
    dequantize_model(model)
    model.update(
        tree_map(
            lambda x: x.astype(mx.float32) if mx.issubdtype(x.dtype, mx.floating) else x, model.parameters()
        )
    )
    mx.eval(model.parameters())


def prepare_base(
    model: nn.Module, keep_quantized: bool = False, memory: int | None = None, fine_tune_type: str = "lora"
) -> str | None:
    """Dequantise a quantized base on the CPU when its float32 copy fits; says what was done.

    Returns one line for the run's log (None for a model that is not
    quantized). `memory`: bytes available (default: measured now). Full
    fine-tuning needs float weights: a base that stays quantized is refused.
    """
    note = _float_copy_if_cpu(model, keep_quantized, memory)
    if fine_tune_type == "full" and quantized_modules(model):
        from ..errors import ConfigError

        raise ConfigError(
            f"fine_tune_type full needs float weights, but the {note}; train adapters (lora or dora) instead"
        )
    return note


def _float_copy_if_cpu(model: nn.Module, keep_quantized: bool, memory: int | None) -> str | None:
    if not quantized_modules(model):
        return None
    bits = describe_bits(model)
    if not on_cpu():
        return f"base weights {bits}: kept quantized ({mx.default_device().type.name} backend)"
    if keep_quantized:
        return (
            f"base weights {bits}: kept quantized (--keep-quantized); MLX's quantized matmul is far "
            f"slower than float32 on the CPU"
        )
    needed = float32_bytes(model)
    memory = available_memory() if memory is None else memory
    gib = 1024**3
    if memory is None or needed > MEMORY_SHARE * memory:
        free = "unknown memory" if memory is None else f"{memory / gib:.1f} GiB"
        return (
            f"base weights {bits}: kept quantized, since a float32 copy ({needed / gib:.2f} GiB) "
            f"would not fit in {MEMORY_SHARE:.0%} of the {free} available"
        )
    dequantize_to_float32(model)
    return (
        f"base weights {bits}: sampling and updates run on a float32 copy ({needed / gib:.2f} GiB of "
        f"{memory / gib:.1f} GiB available), faster on the CPU; --keep-quantized keeps them {bits}"
    )
