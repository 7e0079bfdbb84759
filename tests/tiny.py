"""A very small random Qwen2 model with a byte-level tokenizer, for tests.

Independent of the embedded model, so the engine's tests don't depend on how
that model was trained, and gradients can be checked on a model small enough
for finite differences. It is mlx_grpo/models/random_model.py's random model
(the one scripts/bench.py times) at 259 tokens: the three special tokens and
one per byte, so encoding uses no merges and text round-trips (transformers
loads a model_type "qwen2" tokenizer with Qwen's byte-level pipeline).
"""

from __future__ import annotations

from pathlib import Path

from mlx_grpo.models.random_model import BYTE_VOCAB, build_random_model


def build_tiny_model(folder: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    return build_random_model(
        Path(folder),
        hidden=hidden,
        layers=layers,
        heads=4,
        kv_heads=2,
        intermediate=hidden * 2,
        vocab=BYTE_VOCAB,
        seed=seed,
    )


def build_tiny_quantized_model(folder: Path, bits: int = 4, hidden: int = 64, seed: int = 0) -> Path:
    """The tiny model, quantized by mlx-lm's own quantize_model (groups of 32): a QLoRA base."""
    import json
    import shutil

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model, quantize_model

    folder = Path(folder)
    source = build_tiny_model(folder.with_name(folder.name + "-float"), hidden=hidden, seed=seed)
    model, config = load_model(source)
    model, config = quantize_model(model, config, group_size=32, bits=bits)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return folder
