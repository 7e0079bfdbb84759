"""Supervised fine-tuning's loss: the cross-entropy of the tokens a demonstration teaches.

A row is its token ids and a 0/1 flag per token: 1 on the tokens the model is taught to
write (a completion, every assistant turn of a conversation, a scripted episode's actions),
0 on what it only reads (prompts, observations, padding). The loss is

    L = -sum_{trained t} log p(token_t | tokens_<t) / N

at temperature 1, N the trained tokens of the whole batch (every micro-batch), so that
gradients summed over micro-batches are the batch's mean. A token that is not trained is
left out with `where`, not multiplied by 0: its gradient is exactly zero, even where its
log-probability is -inf.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..device import on_cpu
from ..models.heads import output_head
from . import gradients
from .logprobs import _logprobs_and_entropy, _project


def target_logprobs(model: nn.Module, tokens: mx.array, chunk_size: int | None = None,
                    differentiated: bool = False) -> mx.array:
    """(B, L-1) log-probs at temperature 1: position t scores tokens[:, t+1] given tokens[:, :t+1].

    `differentiated`: the caller takes the gradient; through a frozen head (LoRA) it is then
    worked out in the forward pass (logprobs.py), so no logits are kept for the backward pass."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    head = output_head(model)
    if head is None:
        return _logprobs_and_entropy(model(inputs), targets, 1.0)[0]
    return _project(head, model.model(inputs), targets, 1.0, chunk_size, differentiated=differentiated)[0]


def masked_token_loss(logp: mx.array, trained: mx.array, count) -> mx.array:
    """-sum of the trained targets' log-probs / count. `trained` is (B, L) on the tokens; logp (B, L-1)."""
    keep = trained[:, 1:] > 0
    return -mx.where(keep, logp, mx.zeros_like(logp)).sum() / count


def sft_loss(model: nn.Module, tokens: mx.array, trained: mx.array, count, chunk_size: int | None = None,
             differentiated: bool = True) -> mx.array:
    """The micro-batch's share of the batch loss: its trained tokens' cross-entropy over the batch's `count`."""
    return masked_token_loss(target_logprobs(model, tokens, chunk_size, differentiated), trained, count)


def sft_gradients(model: nn.Module, tokens: mx.array, trained: mx.array, count,
                  chunk_size: int | None = None) -> tuple[mx.array, dict]:
    """(loss share, gradients of the trainable weights) of one micro-batch, evaluated.

    On a CPU compiled whole, as the GRPO update's pieces are (update/gradients.py): fused, the
    norms, RoPE, SwiGLU and the head's softmax stop running op by op, forward and backward."""
    def loss_fn():
        return sft_loss(model, tokens, trained, count, chunk_size)

    def value_and_grad():
        loss, grads = nn.value_and_grad(model, loss_fn)()
        return loss, {}, grads

    compiled = gradients.COMPILE_ON_CPU and on_cpu() and not gradients._dropout_active(model)
    loss, _, grads = gradients._evaluated(model, value_and_grad, compiled)
    return loss, grads


def pad_rows(rows: list[tuple[list[int], list[float]]], pad_id: int) -> tuple[mx.array, mx.array]:
    """Rows of (ids, trained flags), right-padded to the longest: (tokens, trained), padding untrained."""
    width = max(len(ids) for ids, _ in rows)
    tokens = [list(ids) + [pad_id] * (width - len(ids)) for ids, _ in rows]
    flags = [list(flag) + [0.0] * (width - len(flag)) for _, flag in rows]
    return mx.array(tokens), mx.array(flags, dtype=mx.float32)
