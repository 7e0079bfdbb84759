"""Supervised fine-tuning's loss: the cross-entropy of the tokens a demonstration teaches.

A row is its token ids and a 0/1 flag per token: 1 on the tokens the model is taught to
write (a completion, every assistant turn of a conversation, a scripted episode's actions),
0 on what it only reads (prompts, observations, padding). The loss is

    L = -sum_{trained t} log p(token_t | tokens_<t) / N

at temperature 1, N the trained tokens of the whole batch (every micro-batch), so that
gradients summed over micro-batches are the batch's mean. Only the trained positions' hidden
states go through the output head: it is the costliest part of a forward pass (a 152k-word
vocabulary's matmul and softmax per position), and in a scripted web episode most tokens are
observations the model only reads. A token that is not trained is thus never scored: its
gradient is exactly zero, even where its log-probability would be -inf.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..device import on_cpu
from ..models.heads import output_head
from . import gradients
from .logprobs import _logprobs_and_entropy, _project
from .recompute import needs_recompute


def trained_positions(trained: mx.array) -> mx.array:
    """Where the trained targets are: flat indices into the (B * (L-1)) next-token positions.

    `trained` is (B, L) on the tokens; position t of row b predicts token t+1. Worked out
    outside any compiled function: how many there are sets the shapes of what follows."""
    flags = np.array(trained[:, 1:]).reshape(-1)
    return mx.array(np.flatnonzero(flags > 0).astype(np.int32))


def target_logprobs(
    model: nn.Module,
    tokens: mx.array,
    positions: mx.array,
    chunk_size: int | None = None,
    differentiated: bool = False,
) -> mx.array:
    """(N,) log-probs at temperature 1 of the targets at `positions` (trained_positions): position
    t of row b scores tokens[b, t+1] given tokens[b, :t+1].

    `differentiated`: the caller takes the gradient; through a frozen head (LoRA) it is then
    worked out in the forward pass (logprobs.py), so no logits are kept for the backward pass. Each
    log-prob is the target's logit less the log-normaliser, and no entropy is worked out."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)[positions]
    head = output_head(model)
    if head is None:
        logits = model(inputs)
        picked = logits.reshape(-1, logits.shape[-1])[positions][None]
        return _logprobs_and_entropy(picked, targets[None], 1.0, with_entropy=False)[0][0]
    hidden = model.model(inputs)
    picked = hidden.reshape(-1, hidden.shape[-1])[positions][None]
    return _project(
        head, picked, targets[None], 1.0, chunk_size, differentiated=differentiated, with_entropy=False
    )[0][0]


def sft_loss(
    model: nn.Module,
    tokens: mx.array,
    trained: mx.array,
    count,
    chunk_size: int | None = None,
    differentiated: bool = True,
    positions: mx.array | None = None,
) -> mx.array:
    """The micro-batch's share of the batch loss: its trained tokens' cross-entropy over the batch's `count`.

    `positions`: trained_positions(trained), when the caller worked them out already."""
    positions = trained_positions(trained) if positions is None else positions
    if positions.size == 0:  # nothing to learn here: a loss of 0 whose gradient is exactly 0
        return mx.zeros(())
    return -target_logprobs(model, tokens, positions, chunk_size, differentiated).sum() / count


def sft_gradients(
    model: nn.Module, tokens: mx.array, trained: mx.array, count, chunk_size: int | None = None
) -> tuple[mx.array, dict]:
    """(loss share, gradients of the trainable weights) of one micro-batch, evaluated.

    On a CPU compiled whole, as the GRPO update's pieces are (update/gradients.py): fused, the
    norms, RoPE, SwiGLU and the head's softmax stop running op by op, forward and backward."""
    positions = trained_positions(trained)  # outside the trace: their number is a shape

    def loss_fn():
        return sft_loss(model, tokens, trained, count, chunk_size, positions=positions)

    def value_and_grad():
        loss, grads = nn.value_and_grad(model, loss_fn)()
        return loss, {}, grads

    compiled = gradients.COMPILE_ON_CPU and on_cpu() and not gradients._dropout_active(model)
    recompute = needs_recompute(model, *tokens.shape)  # a row too long to keep its activations
    loss, _, grads = gradients._evaluated(model, value_and_grad, compiled, recompute=recompute)
    return loss, grads


def pad_rows(rows: list[tuple[list[int], list[float]]], pad_id: int) -> tuple[mx.array, mx.array]:
    """Rows of (ids, trained flags), right-padded to the longest: (tokens, trained), padding untrained."""
    width = max(len(ids) for ids, _ in rows)
    tokens = [list(ids) + [pad_id] * (width - len(ids)) for ids, _ in rows]
    flags = [list(flag) + [0.0] * (width - len(flag)) for _, flag in rows]
    return mx.array(tokens), mx.array(flags, dtype=mx.float32)
