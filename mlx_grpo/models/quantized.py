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

One layer stays quantized in the copy when only adapters train: the input
embedding of a model with its own output head. It is only looked up, a row
gather, so it costs no matmul time, and a looked-up row dequantised in float32
is exactly that row of the float32 copy; at 0.5B (vocabulary 151936) it saves
over 400 MB. Full fine-tuning trains it, so there it is widened too.
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

from ..device import on_cpu

# The float32 copy must leave room for activations, gradients and the optimizer:
# it is made only when it takes at most this share of the memory available.
MEMORY_SHARE = 0.5

# The float32 copy of a layer is computed in pieces of at most this many bytes: MLX's CPU
# dequantize holds temporaries of about six times its output for 5- and 6-bit weights (once for
# 4- and 8-bit), 3 GB for a 0.5B model's whole 5-bit embedding, about 25 MB for one piece.
PIECE_BYTES = 4 * 2**20


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


def float32_bytes(model: nn.Module, keep: tuple[str, ...] = ()) -> int:
    """Bytes the model's weights would take once every quantized layer is dequantised to float32;
    the layers named in `keep` stay quantized, with float32 scales and biases."""
    total = 0
    bits = {name: m.bits for name, m in quantized_modules(model)}
    for name, value in tree_flatten(model.parameters()):
        module, _, leaf = name.rpartition(".")
        if module in keep:
            total += value.nbytes if leaf == "weight" else value.size * 4
        elif module in bits and leaf in ("scales", "biases"):
            continue  # folded into the dequantised weight
        elif module in bits and leaf == "weight":
            total += value.size * 32 // bits[module] * 4  # 32 bits of a packed uint32 hold 32 / bits weights
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


def dequantize_to_float32(model: nn.Module, keep: tuple[str, ...] = ()) -> None:
    """Replace every quantized layer (except those named in `keep`) by a float32 one holding its
    dequantised weights, and widen every other float weight to float32 (in place).

    One layer at a time, each quantized original let go as its copy takes its place, so memory
    peaks at about the finished copy plus one piece of one layer, not at the copy plus every
    original and every temporary at once (twice the copy, measured on a 0.5B model)."""
    layers = [(name, m) for name, m in quantized_modules(model) if name not in keep]
    layers.reverse()
    while layers:
        name, module = layers.pop()
        plain = _float32_layer(module)
        if plain is not None:
            model.update_modules(tree_unflatten([(name, plain)]))
        del module, plain  # the quantized original goes now, not at the end
        mx.clear_cache()  # and its memory goes back, not into MLX's cache of free buffers
    # The other float weights (norms, biases, widened tensors; a kept layer's scales and biases,
    # which its lookups compute in), one at a time for the same reason.
    leaves = [
        (name, v)
        for name, v in tree_flatten(model.parameters())
        if mx.issubdtype(v.dtype, mx.floating) and v.dtype != mx.float32
    ]
    leaves.reverse()
    while leaves:
        name, value = leaves.pop()
        value = value.astype(mx.float32)
        mx.eval(value)
        model.update(tree_unflatten([(name, value)]))
    mx.clear_cache()


def _float32_layer(module: nn.Module) -> nn.Module | None:
    """The float32 layer of the same kind (as mlx-lm's dequantize_model builds), or None for a kind it
    does not know."""
    if isinstance(module, nn.QuantizedLinear):
        cls, kwargs = nn.Linear, {"bias": "bias" in module}
    elif isinstance(module, nn.QuantizedEmbedding):
        cls, kwargs = nn.Embedding, {}
    elif isinstance(module, QuantizedSwitchLinear):
        cls, kwargs = SwitchLinear, {"bias": "bias" in module}
    else:
        return None
    weight = _dequantized(module)
    plain = cls(*weight.shape[::-1], **kwargs)  # its random initial weights are never computed
    plain.weight = weight
    if "bias" in module:
        plain.bias = module.bias.astype(mx.float32)
    return plain


def _dequantized(module: nn.Module) -> mx.array:
    """mx.dequantize of a quantized layer's weight in float32, computed a piece of rows at a time.

    Scales and biases in float32 first: mx.dequantize computes in their dtype, and a float16 scale
    times an 8-bit level (a GGUF Q8_0 block) needs more bits than float16 has. Each value depends only
    on its own group, so pieces of rows give exactly the values of one call on the whole weight."""
    weight = module.weight
    rows = weight.reshape(-1, weight.shape[-1])
    scales = _as_float32(module.scales)
    scales = scales.reshape(-1, scales.shape[-1])
    biases = getattr(module, "biases", None)
    biases = None if biases is None else _as_float32(biases).reshape(scales.shape)
    width = scales.shape[-1] * module.group_size  # weights a row
    step = max(1, PIECE_BYTES // (width * 4))
    out = mx.zeros((rows.shape[0], width), mx.float32)
    for i in range(0, rows.shape[0], step):
        piece = slice(i, i + step)
        out[piece] = mx.dequantize(
            rows[piece],
            scales[piece],
            None if biases is None else biases[piece],
            module.group_size,
            module.bits,
            module.mode,
        )
        mx.eval(out)  # MLX writes each piece into `out` in place: it holds the only reference
    return out.reshape(*weight.shape[:-1], width)


def _as_float32(x: mx.array) -> mx.array:
    return x.astype(mx.float32) if mx.issubdtype(x.dtype, mx.floating) else x


def prepare_base(
    model: nn.Module, keep_quantized: bool = False, memory: int | None = None, fine_tune_type: str = "lora"
) -> str | None:
    """Dequantise a quantized base on the CPU when its float32 copy fits; says what was done.

    Returns one line for the run's log (None for a model that is not
    quantized). `memory`: bytes available (default: measured now). Full
    fine-tuning needs float weights: a base that stays quantized is refused.
    Adapters (lora, dora) leave the base frozen: a lookup-only embedding
    stays quantized in the copy (see the module's docstring).
    """
    keep = () if fine_tune_type == "full" else lookup_only_embedding(model)
    note = _float_copy_if_cpu(model, keep_quantized, memory, keep)
    if fine_tune_type == "full" and quantized_modules(model):
        from ..errors import ConfigError

        raise ConfigError(
            f"fine_tune_type full needs float weights, but the {note}; train adapters (lora or dora) instead"
        )
    return note


def lookup_only_embedding(model: nn.Module) -> tuple[str, ...]:
    """The name of the quantized input embedding when it is only looked up, else nothing.

    A tied embedding is also the output head (`as_linear`), a quantized matmul on every token: that
    one is widened."""
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    if isinstance(embedding, nn.QuantizedEmbedding) and hasattr(model, "lm_head"):
        return ("model.embed_tokens",)
    return ()


def _float_copy_if_cpu(
    model: nn.Module, keep_quantized: bool, memory: int | None, keep: tuple[str, ...]
) -> str | None:
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
    needed = float32_bytes(model, keep)
    memory = available_memory() if memory is None else memory
    gib = 1024**3
    if memory is None or needed > MEMORY_SHARE * memory:
        free = "unknown memory" if memory is None else f"{memory / gib:.1f} GiB"
        return (
            f"base weights {bits}: kept quantized, since a float32 copy ({needed / gib:.2f} GiB) "
            f"would not fit in {MEMORY_SHARE:.0%} of the {free} available"
        )
    kept = (
        f", its input embedding kept {describe_bits(model.model.embed_tokens)} (only looked up)"
        if keep
        else ""
    )
    dequantize_to_float32(model, keep)
    return (
        f"base weights {bits}: sampling and updates run on a float32 copy ({needed / gib:.2f} GiB of "
        f"{memory / gib:.1f} GiB available){kept}, faster on the CPU; --keep-quantized keeps them {bits}"
    )
