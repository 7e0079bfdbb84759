"""The trainable part of a policy: LoRA/DoRA adapters or full weights, and its reference.

Adapters are saved in mlx-lm's own format (`adapters.safetensors` +
`adapter_config.json`), so `mlx_lm.generate --adapter-path RUN_DIR` and
`mlx_lm.fuse` work on a run folder unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.tuner.dora import DoRAEmbedding, DoRALinear
from mlx_lm.tuner.lora import LoRAEmbedding, LoRALinear, LoRASwitchLinear
from mlx_lm.tuner.utils import linear_to_lora_layers

from .quantized import quantized_modules

FINE_TUNE_TYPES = ("lora", "dora", "full")
_ADAPTER_TYPES = (LoRALinear, LoRASwitchLinear, LoRAEmbedding, DoRALinear, DoRAEmbedding)


def prepare_for_training(model: nn.Module, fine_tune_type: str = "lora", lora: dict | None = None) -> dict:
    """Make the trainable part of the model; returns the adapter config to save.

    lora: {"rank", "scale", "dropout", "num_layers"}; num_layers=-1 means all.
    """
    if fine_tune_type not in FINE_TUNE_TYPES:
        raise ValueError(f"fine_tune_type must be one of {FINE_TUNE_TYPES}")
    lora = {"rank": 8, "scale": 20.0, "dropout": 0.0, "num_layers": -1, **(lora or {})}
    num_layers = len(model.layers) if lora["num_layers"] in (-1, None) else int(lora["num_layers"])
    params = {k: lora[k] for k in ("rank", "scale", "dropout")}
    if fine_tune_type == "full":
        # A quantized layer's weights stay frozen through unfreeze(): full fine-tuning would skip them
        # silently (a base loaded for adapters keeps its lookup-only embedding quantized: quantized.py).
        if quantized_modules(model):
            raise ValueError(
                "full fine-tuning needs float weights, but the base has quantized layers: "
                "prepare_base(model, fine_tune_type='full') widens them all on the CPU"
            )
        model.unfreeze()
    else:
        model.freeze()
        linear_to_lora_layers(model, num_layers, params, use_dora=fine_tune_type == "dora")
    return {"fine_tune_type": fine_tune_type, "num_layers": num_layers, "lora_parameters": params}


def trainable_parameter_count(model: nn.Module) -> int:
    return sum(v.size for _, v in tree_flatten(model.trainable_parameters()))


@contextmanager
def _modules_swapped(model: nn.Module, replacements: list[tuple[str, nn.Module]]):
    """Run the model with some named modules replaced; the originals go back afterwards."""
    originals = dict(model.named_modules())
    if replacements:
        model.update_modules(tree_unflatten(replacements))
    try:
        yield model
    finally:
        if replacements:
            model.update_modules(tree_unflatten([(name, originals[name]) for name, _ in replacements]))


def adapters_disabled(model: nn.Module):
    """Run the base model: every adapter layer is swapped for the layer it wraps.

    This is the reference policy for LoRA/DoRA without a second copy of the
    weights. Swapping (rather than zeroing the LoRA scale) is exact for DoRA too.
    """
    return _modules_swapped(
        model,
        [
            (name, m.embedding if hasattr(m, "embedding") else m.linear)
            for name, m in model.named_modules()
            if isinstance(m, _ADAPTER_TYPES)
        ],
    )


# Merged weights are a second copy of every adapted weight while sampling: worth it
# below this size, where decode steps are bound by the number of operations. Above it
# the matmuls dominate (SmolLM2-135M: the copy is 425 MB, the two small adapter
# matmuls a few percent of a decode step) and the copy would set the step's peak memory.
MERGE_LIMIT_BYTES = 64 * 2**20


def adapters_merged(model: nn.Module):
    """Run LoRA layers as single linears, W + scale * B A, while sampling (small models).

    One matmul per layer instead of three (and their elementwise glue): decode
    steps of small models are bound by the number of operations. Only float32,
    unquantized bases are merged: in bfloat16 the merged sum would round away
    most of a small adapter, and the sampling policy would drift from the
    trained one. Nothing is merged when the copy would pass MERGE_LIMIT_BYTES.
    Used in eval mode only (no LoRA dropout).
    """
    layers = [
        (name, m)
        for name, m in model.named_modules()
        if type(m) is LoRALinear and type(m.linear) is nn.Linear and m.linear.weight.dtype == mx.float32
    ]
    if sum(m.linear.weight.nbytes for _, m in layers) > MERGE_LIMIT_BYTES:
        layers = []
    return _modules_swapped(model, [(name, m.fuse()) for name, m in layers])


@contextmanager
def weights_swapped(model: nn.Module, params):
    """Temporarily run the model with other weights (the full fine-tuning reference)."""
    current = model.parameters()
    model.update(params)
    try:
        yield model
    finally:
        model.update(current)


def save_adapters(model: nn.Module, folder: Path, adapter_config: dict) -> None:
    """Write adapters.safetensors + adapter_config.json the way mlx-lm does.

    Files are written to a temporary name and renamed, so a reader never sees
    a half-written file.
    """
    from ..files import atomic_save_safetensors, atomic_write_json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.trainable_parameters()))
    atomic_save_safetensors(folder / "adapters.safetensors", weights)
    atomic_write_json(folder / "adapter_config.json", adapter_config)
