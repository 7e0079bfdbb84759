"""The patches bench.py runs a trainer under, each a context manager: `replaced` (one module attribute for a
block), `stops_ignored` (equal work: no token ends a completion), `synthetic_rollouts` (the update alone), and
VARIANTS, mlx-grpo with one of its measures taken away (timing only), run beside it on equal load.
"""

from __future__ import annotations

import contextlib
import math

import mlx.core as mx
import numpy as np


@contextlib.contextmanager
def replaced(module, name, value):
    """`module.name` is `value` inside the block, and what it was again after it."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


@contextlib.contextmanager
def stops_ignored(tokenizer):
    """Both samplers decode every completion to max_tokens: no token ends one (the same work for both).

    mlx-lm-lora stops at tokenizer.eos_token_ids (and at its end_answer_token,
    empty here); mlx-grpo at rollout.end_token_ids(tokenizer), the same ids.
    Emptied, an end token is sampled like any other and the row goes on.
    """
    from mlx_grpo.sampling import rollout

    saved = set(tokenizer.eos_token_ids)
    tokenizer.eos_token_ids = set()
    try:
        with replaced(rollout, "end_token_ids", lambda tokenizer: []):
            yield
    finally:
        tokenizer.eos_token_ids = saved


# ---------------------------------------------------------------- variants (timing only)


def without_shared_prefill():
    """Rollouts prefill every group member's prompt separately, as without sharing."""
    from mlx_grpo.sampling import fixed_decode

    shared = fixed_decode._prefilled_buffers

    def separate(model, prompts, prefix_length, max_tokens):
        rows = [shared(model, [p], prefix_length, max_tokens) for p in prompts]
        return (
            [mx.concatenate(layer) for layer in zip(*(keys for keys, _ in rows))],
            [mx.concatenate(layer) for layer in zip(*(values for _, values in rows))],
        )

    return replaced(fixed_decode, "_prefilled_buffers", separate)


def with_generator_decode():
    """Rollouts through mlx-lm's BatchGenerator (growing caches, nothing compiled), as models without
    plain caches do."""
    from mlx_grpo.sampling import fixed_decode

    return replaced(fixed_decode, "supports_fixed_decode", lambda model, length=None: False)


def without_merged_adapters():
    """The fixed decoder runs LoRA layers as three matmuls instead of one merged weight."""
    from mlx_grpo.sampling import rollout

    return replaced(rollout, "adapters_merged", contextlib.nullcontext)


def with_merged_adapters_any_size():
    """LoRA merged into the weights while sampling at any model size (the product merges below
    MERGE_LIMIT_BYTES)."""
    from mlx_grpo.models import adapters

    return replaced(adapters, "MERGE_LIMIT_BYTES", float("inf"))


def with_mlx_exp():
    """MLX's own exp, log-sum-exp and SiLU on the CPU instead of models/cpu_math.py's."""
    from mlx_grpo.models import cpu_math

    return replaced(cpu_math, "on_cpu", lambda: False)


def without_shared_prompt_forward():
    """The update runs every sequence's own copy of its prompt, instead of each prompt once per group."""
    import dataclasses

    import mlx.nn as nn

    from mlx_grpo.update import step
    from mlx_grpo.update.logprobs import prompt_pass

    def per_sequence(model, parts, refs, after_prompt, loss_of):
        for i, mb in enumerate(parts):
            g = mb.group_size
            rows = dataclasses.replace(
                mb,
                prompts=mx.repeat(mb.prompts, g, axis=0),
                left_padding=mx.repeat(mb.left_padding, g),
                group_size=1,
                piece_of=None,
            )

            def loss_fn(model, rows=rows, ref=refs[i] if refs else None):
                logp, entropy = after_prompt(model, prompt_pass(model, rows.prompts, rows.left_padding), rows)
                return loss_of(logp, entropy, rows, ref)

            (loss, stats), grads = nn.value_and_grad(model, loss_fn)(model)
            mx.eval(loss, stats, grads)
            yield loss, stats, grads

    return replaced(step, "micro_batch_gradients", per_sequence)


def synthetic_rollouts():
    """Completions of exactly max_tokens random tokens, sampled by nobody: for measuring the update alone.

    The longest completions are the update's worst case for memory; decoding them
    for real on a shared 2-core CPU takes far longer than the update itself.
    """
    import importlib

    from mlx_grpo.sampling.rollout import Completion

    def sample(model, tokenizer, prompts, group_size, sampling, *args, **kwargs):
        vocab = model.model.embed_tokens.weight.shape[0]
        rng = np.random.default_rng(len(prompts))
        out = []
        for i, prompt in enumerate(prompts):
            for _ in range(group_size):
                tokens = [int(t) for t in rng.integers(3, vocab, sampling.max_tokens)]  # no end token
                out.append(
                    Completion(
                        i,
                        list(prompt),
                        tokens,
                        [-math.log(vocab)] * len(tokens),
                        "length",
                        tokenizer.decode(tokens),
                    )
                )
        return out

    stack = contextlib.ExitStack()
    for name in ("mlx_grpo.run.step_rollouts", "mlx_grpo.run.trainer"):  # wherever the trainer calls it from
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "sample_completions"):
            stack.enter_context(replaced(module, "sample_completions", sample))
    return stack


# name: (setting overrides, patch). Each runs interleaved with the others, so all see the same load.
VARIANTS = {
    "decode_concurrency_2": ({"decode_concurrency": 2}, None),  # the peer's default decode width here
    "no_shared_prefill": ({}, without_shared_prefill),
    "generator_decode": ({}, with_generator_decode),
    "unmerged_adapters": ({}, without_merged_adapters),
    "merged_adapters_any_size": ({}, with_merged_adapters_any_size),
    "no_shared_prompt_forward": ({}, without_shared_prompt_forward),
    "mlx_exp": ({}, with_mlx_exp),
    "logprob_chunk_32": ({"logprob_chunk_size": 32}, None),
    "micro_batch_4": ({"micro_batch_size": 4}, None),
}
