"""The PPO-clipped GRPO objective (token log-probs come from logprobs.py).

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

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")

@dataclass
class BatchShape:
    """Sizes of the whole accumulated batch, which the normalisations need."""

    num_sequences: int
    num_tokens: int
    num_micro_batches: int
    max_tokens: int


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
