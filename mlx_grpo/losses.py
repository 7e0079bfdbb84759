"""Token log-probabilities and the PPO-clipped GRPO objective.

Per completion token t, with logp = log pi_theta(o_t) at temperature T, the
behaviour log-prob log mu(o_t) recorded by the sampler, and the advantage A of
the whole completion:

    r_t = exp(logp - log mu)
    L_t = -min(r_t * A, clip(r_t, 1 - eps_low, 1 + eps_high) * A)
        + beta * k3_t,      k3_t = exp(ref - logp) - (ref - logp) - 1

(PPO: Schulman et al. 2017, arXiv:1707.06347; GRPO: Shao et al. 2024,
arXiv:2402.03300; k3: Schulman, "Approximating KL divergence", 2020.)

How the token terms become one number (DESIGN.md, "Normalisation"):

    grpo     mean over sequences of each sequence's token mean
    bnpo     token sum / token count of the micro-batch
    dr_grpo  token sum / (sequences * max_tokens)          (Liu et al. 2025, arXiv:2503.20783)
    dapo     token sum / token count of the whole batch    (Yu et al. 2025, arXiv:2503.14476)

Gradients are accumulated over micro-batches by summing, so each micro-batch's
loss is scaled here such that the sum over micro-batches is the loss of the
whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")

# Models whose logits are exactly head(model.model(inputs)): for these the
# output projection can be applied a chunk of positions at a time.
_PLAIN_HEAD_MODEL_TYPES = {"qwen2", "qwen3", "llama", "mistral", "phi3", "olmo2", "smollm3"}


@dataclass
class BatchShape:
    """Sizes of the whole accumulated batch, which the normalisations need."""

    num_sequences: int
    num_tokens: int
    num_micro_batches: int
    max_tokens: int


def _logprobs_and_entropy(logits, targets, temperature):
    if logits.dtype in (mx.float16, mx.bfloat16):  # softmax in half precision loses the tails
        logits = logits.astype(mx.float32)
    logits = logits / temperature
    lse = mx.logsumexp(logits, axis=-1)
    logp = mx.take_along_axis(logits, targets[..., None], axis=-1).squeeze(-1) - lse
    # Entropy is only watched, never optimised here: keep it out of the backward pass.
    probs = mx.softmax(mx.stop_gradient(logits), axis=-1)
    entropy = mx.stop_gradient(lse) - mx.sum(probs * mx.stop_gradient(logits), axis=-1)
    return logp, entropy


def _output_head(model):
    if getattr(model, "model_type", None) not in _PLAIN_HEAD_MODEL_TYPES:
        return None
    if hasattr(model, "lm_head"):
        return model.lm_head, model.lm_head
    embed = model.model.embed_tokens
    return embed, embed.as_linear


def token_logprobs(model: nn.Module, tokens: mx.array, temperature: float = 1.0, chunk_size: int | None = None):
    """Log-prob (at `temperature`) and entropy of each next token.

    tokens: (B, L) int array. Returns two (B, L-1) arrays: position t scores
    tokens[:, t+1] given tokens[:, :t+1].

    With `chunk_size`, the vocabulary projection runs `chunk_size` positions at
    a time under `mx.checkpoint`, so no (B, L, vocab) float32 tensor is kept for
    the backward pass: with a 150k vocabulary that tensor alone is gigabytes.
    """
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    head = _output_head(model) if chunk_size else None
    if head is None or inputs.shape[1] <= chunk_size:
        return _logprobs_and_entropy(model(inputs), targets, temperature)

    module, project = head
    hidden = model.model(inputs)

    def chunk_fn(t):
        # Targets are closed over: checkpoint would otherwise try to
        # differentiate with respect to the integer indices.
        def chunk(params, h):
            module.update(params)
            return _logprobs_and_entropy(project(h), t, temperature)

        return mx.checkpoint(chunk)

    params = module.parameters()
    parts = [
        chunk_fn(targets[:, s : s + chunk_size])(params, hidden[:, s : s + chunk_size])
        for s in range(0, inputs.shape[1], chunk_size)
    ]
    logp = mx.concatenate([p[0] for p in parts], axis=1)
    entropy = mx.concatenate([p[1] for p in parts], axis=1)
    return logp, entropy


def kl_k3(logp, ref_logp):
    """Schulman's k3 estimator of KL(pi_theta || pi_ref), per token: always >= 0."""
    log_ratio = ref_logp - logp
    return mx.exp(log_ratio) - log_ratio - 1


def policy_loss(
    logp,
    behaviour_logp,
    advantages,
    mask,
    batch: BatchShape,
    *,
    loss_type: str = "grpo",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    ref_logp=None,
):
    """The micro-batch's share of the batch loss, and token statistics (sums).

    logp, behaviour_logp, mask: (B, T); advantages: (B,). mask is 1 on the
    completion tokens that are trained on and 0 on prompt and padding.
    """
    mask = mask.astype(mx.float32)
    adv = advantages[:, None]
    ratio = mx.exp(logp - behaviour_logp)
    clipped_ratio = mx.clip(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = -mx.minimum(ratio * adv, clipped_ratio * adv)
    kl = None
    if beta > 0:
        kl = kl_k3(logp, ref_logp)
        per_token = per_token + beta * kl

    token_sum = (per_token * mask).sum()
    if loss_type == "grpo":
        seq_means = (per_token * mask).sum(axis=1) / mx.maximum(mask.sum(axis=1), 1)
        loss = seq_means.sum() / batch.num_sequences
    elif loss_type == "bnpo":
        loss = token_sum / mx.maximum(mask.sum(), 1) / batch.num_micro_batches
    elif loss_type == "dr_grpo":
        loss = token_sum / (batch.num_sequences * batch.max_tokens)
    elif loss_type == "dapo":
        loss = token_sum / max(batch.num_tokens, 1)
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}; choose from {LOSS_TYPES}")

    # A token is clipped when the clipped branch of the min is the active one:
    # then its gradient is zero.
    low = (ratio < 1 - epsilon_low) & (adv < 0)
    high = (ratio > 1 + epsilon_high) & (adv > 0)
    stats = {
        "tokens": mask.sum(),
        "clipped": ((low | high) * mask).sum(),
        "ratio": (mx.stop_gradient(ratio) * mask).sum(),
    }
    if kl is not None:
        stats["kl"] = (mx.stop_gradient(kl) * mask).sum()
    return loss, stats
