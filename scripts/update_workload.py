"""The workload of scripts/profile_update.py: a synthetic GRPO batch cut into micro-batches by the
trainer's own prepare_update, the caches a prompt pass hands the completions, and the model's linears
(adapted or not) with their matmul FLOPs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
from bench_variants import replaced  # noqa: E402
from mlx_lm.tuner.lora import LoRALinear  # noqa: E402

from mlx_grpo.config import FIELDS, TrainConfig  # noqa: E402
from mlx_grpo.run.step_update import Trained, prepare_update  # noqa: E402
from mlx_grpo.sampling.rollout import Completion  # noqa: E402
from mlx_grpo.tasks.registry import Task  # noqa: E402
from mlx_grpo.update import batch  # noqa: E402
from mlx_grpo.update.logprobs import SharedPromptCache  # noqa: E402


def synthetic_update(model, model_path: str, vocab: int, args):
    """(config, PreparedUpdate) of a random batch, through the trainer's own prepare_update."""
    rng = np.random.default_rng(0)
    completions = []
    for i in range(args.prompts):
        prompt = [int(t) for t in rng.integers(3, vocab, args.prompt_tokens)]
        for _ in range(args.group_size):  # "stop": every token stays in the loss whatever mask_truncated says
            tokens = [int(t) for t in rng.integers(3, vocab, args.max_tokens)]
            completions.append(
                Completion(i, prompt, tokens, [-float(np.log(vocab))] * len(tokens), "stop", "")
            )
    advantages = rng.normal(size=len(completions)).astype(np.float32)  # every group carries signal
    settings = dict(
        model=model_path,
        task="custom",
        batch_size=args.prompts,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        lora_rank=args.lora_rank,
        lora_layers=args.lora_layers,
        kl_every=0,
        micro_batch_size=args.micro_batch or 16,
    )
    config = TrainConfig.from_flat({k: v for k, v in settings.items() if k in FIELDS})
    task = Task(
        name="profile",
        train_rows=[],
        eval_rows=[],
        reward_functions=[],
        reward_weights=[],
        system_prompt=None,
        accuracy_reward=None,
        warnings=[],
    )
    trained = Trained(completions, advantages, np.arange(len(completions)))
    # --micro-batch N is taken as given: the activation budget would cut it down on a CPU.
    budget = float("inf") if args.micro_batch else batch.CPU_ACTIVATION_BUDGET
    with replaced(batch, "CPU_ACTIVATION_BUDGET", budget):
        return config, prepare_update(model, trained, task, config, 1, None)


def completion_cache(state, mb):
    """The per-layer caches logprobs_after_prompt builds from a prompt pass's state."""
    cache = [SharedPromptCache(mb.left_padding, mb.group_size) for _ in state[0]]
    for layer, k, v in zip(cache, state[0], state[1]):
        layer.keys, layer.values, layer.offset = k, v, k.shape[2]
    return cache


def adapted_linears(model):
    """Per layer, (weight, lora_a, lora_b) of each linear (lora_a and lora_b None where not adapted)."""
    layers = []
    for layer in model.layers:
        modules = [m for _, m in layer.named_modules()]
        lora = [m for m in modules if isinstance(m, LoRALinear)]
        wrapped = {id(m.linear) for m in lora}
        linears = [(m.linear.weight, m.lora_a, m.lora_b) for m in lora]
        linears += [
            (m.weight, None, None) for m in modules if isinstance(m, nn.Linear) and id(m) not in wrapped
        ]
        if any(not mx.issubdtype(w.dtype, mx.floating) for w, _, _ in linears):
            raise SystemExit(
                "error: profile_update.py times float matmuls: pass --dequantize for a quantized model"
            )
        layers.append(linears)
    return layers


def matmul_flops(layers, rows: list[int], lowest: int = 0) -> tuple[float, float]:
    """(dense, LoRA) FLOPs over micro-batches of `rows` body positions. Dense: x W^T in every layer and
    dY W in the layers from `lowest` up (the backward stops below the lowest trained layer), 2 m in out each;
    LoRA: six rank-r matmuls an adapted linear, three of 2 m r in and three of 2 m r out."""
    dense = sum(
        (2.0 + 2.0 * (j >= lowest)) * m * w.shape[0] * w.shape[1]
        for m in rows
        for j, layer in enumerate(layers)
        for w, _, _ in layer
    )
    linears = [x for layer in layers for x in layer]
    return dense, sum(
        6.0 * m * a.shape[1] * sum(w.shape) for m in rows for w, a, _ in linears if a is not None
    )
