"""bench.py's workload and its arithmetic: the random models' shapes (--preset), the prompts, the reward
a random model can learn, a model's shape read from its folder, and the useful FLOPs of a step.

bench_sft.py, profile_update.py, profile_sft.py, profile_forward.py, decode_ceiling.py and gpu_profile.py
measure the same shapes and count FLOPs the same way. The random model of a preset's shape is
mlx_grpo/models/random_model.py's build_random_model.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

PRESETS = {
    # The default workload.
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512),
    # A larger model that still runs in minutes on a small CPU.
    "small": dict(hidden=256, layers=4, heads=8, kv_heads=2, intermediate=768, vocab=8192),
    # Qwen2.5-0.5B's shape, random weights.
    "qwen0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936),
}


def dequantized_copy(model: str, folder: Path) -> str:
    """A float32 copy of a (quantized) model, as an mlx-lm folder: the CPU's float matmuls are far faster."""
    from mlx_lm.convert import convert

    from mlx_grpo.models.loading import model_folder

    with contextlib.redirect_stdout(io.StringIO()):
        convert(model_folder(model), mlx_path=str(folder), dequantize=True, dtype="float32")
    return str(folder)


def letter_share(prompts, completions, **columns):
    """Reward: the share of a completion's characters that are ASCII letters."""
    return [sum(c.isascii() and c.isalpha() for c in text) / max(len(text), 1) for text in completions]


def prompt_texts(n: int) -> list[str]:
    return [f"Write a short line of plain English words, number {i + 1}." for i in range(n)]


def model_shape(path: str) -> dict:
    """hidden, layers, heads, ... from a model folder's config.json."""
    from mlx_lm.utils import load_config

    from mlx_grpo.models.loading import model_folder

    local = Path(model_folder(path))  # a GGUF file or alias: its converted folder
    if not local.exists():
        from mlx_lm.utils import _download

        local = Path(_download(path))
    c = load_config(local)
    return dict(
        hidden=c["hidden_size"],
        layers=c["num_hidden_layers"],
        heads=c["num_attention_heads"],
        kv_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
        intermediate=c["intermediate_size"],
        vocab=c["vocab_size"],
    )


# ---------------------------------------------------------------- FLOPs


def forward_flops(shape: dict, tokens: float, context: float) -> float:
    """Matmul FLOPs of a forward pass over `tokens` positions seeing `context` keys on average."""
    h, layers, v = shape["hidden"], shape["layers"], shape["vocab"]
    head_dim = h // shape["heads"]
    kv = shape["kv_heads"] * head_dim
    weights = layers * (2 * h * h + 2 * h * kv + 3 * h * shape["intermediate"]) + v * h
    attention = layers * 2 * h * context  # QK^T and AV
    return 2 * tokens * (weights + attention)


def step_flops(
    shape: dict, prompt_lengths: list[int], completion_lengths: list[int], group: int, backward_factor: float
) -> tuple[float, float]:
    """(rollout, update) useful FLOPs of one step.

    Useful work counts each prompt once per group (what a shared prefill needs)
    and each completion token once. The update is forward + backward:
    `backward_factor` 2 for adapters (gradients of activations, not of the
    frozen weights), 3 for full fine-tuning.
    """
    rollout = update = 0.0
    for i, p in enumerate(prompt_lengths):
        prefill = forward_flops(shape, p, p / 2)
        rollout += prefill
        update += prefill
        for k in completion_lengths[i * group : (i + 1) * group]:
            decode = forward_flops(shape, k, p + k / 2)
            rollout += decode
            update += decode
    return rollout, update * backward_factor
