"""The policy-gradient objectives (token log-probs come from logprobs.py).

Per completion token t, with logp = log pi_theta(o_t) at temperature T, the
behaviour log-prob log mu(o_t) recorded by the sampler, the advantage A of the
whole completion and r_t = exp(logp - log mu):

  PPO-clip (grpo, bnpo, dr_grpo, dapo)                  Schulman et al. 2017, arXiv:1707.06347
      L_t = -min(min(r_t, delta) * A, clip(r_t, 1 - eps_low, 1 + eps_high) * A)
      (delta: the optional two-sided cap; off when None)
  CISPO                                                 MiniMax 2025, arXiv:2506.13585
      L_t = -sg(min(r_t, 1 + eps_high)) * A * logp      (the weight is clipped, every gradient kept)
  GSPO                                                  Zheng et al. 2025, arXiv:2507.18071
      s_i = exp(mean_t(logp - log mu))                  (one ratio per sequence)
      L_i = -min(s_i * A, clip(s_i, 1 - eps_low, 1 + eps_high) * A)
  SAPO                                                  Gao et al. 2025, arXiv:2511.20347
      L_t = -(4 / tau) * sigmoid(tau * (r_t - 1)) * A   (tau = tau_pos if A > 0 else tau_neg)

  Reference tokens of a guided group (guide_shaping = gamma > 0)   LUFFY: Yan et al. 2025, arXiv:2504.14945
      L_t = -A * p_t / (p_t + gamma),  p_t = exp(logp)  (in place of the row's term above; no clip)
      Its gradient is A * gamma * p_t / (p_t + gamma)^2 times that of logp: near 0 for tokens the
      policy finds unlikely, at most A / 4 (p_t = gamma), where a sampled token's weight is A.

  KL to the reference (beta > 0), per token:            Schulman, "Approximating KL", 2020
      + beta * k3_t,  k3_t = exp(ref - logp) - (ref - logp) - 1
  Entropy bonus (entropy_coef > 0): - entropy_coef * H_t.

How the token terms become one number (DESIGN.md, "Normalisation"):

    grpo, sapo     mean over sequences of each sequence's token mean   (Shao et al. 2024, arXiv:2402.03300)
    bnpo           token sum / token count of the micro-batch
    dr_grpo        token sum / (sequences * max_tokens)                (Liu et al. 2025, arXiv:2503.20783)
    dapo, cispo    token sum / token count of the whole batch          (Yu et al. 2025, arXiv:2503.14476)
    gspo           mean over sequences of L_i (its KL/entropy terms are per-sequence token means)

Gradients are accumulated over micro-batches by summing, so each micro-batch's
loss is scaled here such that the sum over micro-batches is the loss of the
whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import mlx.core as mx
import numpy as np

# One line each for --help and the docs: (what it is, the paper).
LOSS_DESCRIPTIONS = {
    "grpo": ("PPO-clip, mean of per-sequence token means", "Shao et al. 2024, arXiv:2402.03300"),
    "bnpo": ("PPO-clip, token mean of each micro-batch", "Xiao et al. 2025, arXiv:2506.02864"),
    "dr_grpo": (
        "PPO-clip, token sum / (sequences x max_tokens): no length bias",
        "Liu et al. 2025, arXiv:2503.20783",
    ),
    "dapo": ("PPO-clip, token mean of the whole batch", "Yu et al. 2025, arXiv:2503.14476"),
    "cispo": (
        "clipped importance-sampling weight, gradients of every token kept",
        "MiniMax 2025, arXiv:2506.13585",
    ),
    "gspo": (
        "one length-normalised ratio per sequence, clipped per sequence",
        "Zheng et al. 2025, arXiv:2507.18071",
    ),
    "sapo": (
        "a smooth sigmoid gate on the ratio instead of a hard clip",
        "Gao et al. 2025, arXiv:2511.20347",
    ),
}
LOSS_TYPES = tuple(LOSS_DESCRIPTIONS)
PPO_CLIP_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")


def same_at_any_cut(loss_type: str) -> bool:
    """Whether the loss is the same however the batch's rows are cut into micro-batches: every one but
    bnpo, whose token mean is per micro-batch (so its rows stay in sampling order, batch.py `by_length`)."""
    return loss_type != "bnpo"


@dataclass
class BatchShape:
    """Sizes of the whole accumulated batch, which the normalisations need."""

    num_sequences: int
    num_tokens: int
    num_micro_batches: int
    max_tokens: int


@dataclass
class LossSettings:
    """The objective's settings, each given (run/step_update.py's update_settings builds them from the
    config's objective group): no default here, the settings' defaults are setting_groups.py's."""

    loss_type: str
    epsilon_low: float
    epsilon_high: float
    delta: float | None  # two-sided cap on the unclipped ratio (PPO-clip losses)
    beta: float
    sapo_tau_pos: float
    sapo_tau_neg: float
    entropy_coef: float
    guide_shaping: float  # gamma of the reference tokens' shaped term (0: trained like sampled tokens)


def kl_k3(logp, ref_logp):
    """Schulman's k3 estimator of KL(pi_theta || pi_ref), per token: always >= 0."""
    log_ratio = ref_logp - logp
    return mx.exp(log_ratio) - log_ratio - 1


def masked_k3(logp, ref_logp, mask):
    """kl_k3 on the tokens of `mask`, 0 elsewhere. Off the mask the reference reads logp, so its log-ratio
    is 0 there: an unlikely token outside the mask cannot overflow exp and turn the masked sum into NaN."""
    return kl_k3(logp, mx.where(mask > 0, ref_logp, logp)) * mask


def sampled_tokens(mask, guided):
    """`mask` without the rows that are reference answers (--guide): the tokens the policy sampled.

    k3 estimates the KL only in expectation over the policy's own samples. A reference was never
    drawn from the policy, and exp(ref - logp) is unbounded on its tokens the policy finds unlikely:
    one such token can lift a step's mean k3 from about 1 to thousands.
    """
    if guided is None:
        return mask
    return mx.where(guided.astype(mx.bool_)[:, None], 0.0, mask)


def _ppo_clip(ratio, adv, s: LossSettings):
    """Token loss and which tokens the clip made inactive (their gradient is zero)."""
    unclipped = mx.minimum(ratio, s.delta) if s.delta is not None else ratio
    loss = -mx.minimum(unclipped * adv, mx.clip(ratio, 1 - s.epsilon_low, 1 + s.epsilon_high) * adv)
    clipped = ((ratio < 1 - s.epsilon_low) & (adv < 0)) | ((ratio > 1 + s.epsilon_high) & (adv > 0))
    if s.delta is not None:
        clipped = clipped | ((ratio > s.delta) & (adv < 0))
    return loss, clipped


def _token_mean_per_sequence(x, mask):
    return (x * mask).sum(axis=1) / mx.maximum(mask.sum(axis=1), 1)


def policy_loss(
    logp,
    behaviour_logp,
    advantages,
    mask,
    batch: BatchShape,
    settings: LossSettings,
    *,
    ref_logp=None,
    entropy=None,
    token_weight=None,
    guided=None,
    **overrides,
):
    """The micro-batch's share of the batch loss, and token statistics (sums).

    logp, behaviour_logp, mask: (B, T); advantages: (B,). mask is 1 on the
    completion tokens that count and 0 on prompt and padding. token_weight
    (B, T), optional, multiplies each token's policy term without changing the
    normalisers (the top-entropy token mask). entropy (B, T) is needed, with
    its gradient, only when entropy_coef > 0. guided (B,), optional, marks the
    rows that are reference answers (--guide): with guide_shaping > 0 their
    tokens take the shaped term. Keyword overrides (loss_type=, beta=, ...)
    replace fields of `settings`.
    """
    s = replace(settings, **overrides) if overrides else settings
    mask = mask.astype(mx.float32)
    adv = advantages[:, None]
    # A token out of the loss reads logp 0 (the update scores only masked-in tokens, logprobs.py): its
    # ratio to an unlikely behaviour log-prob could overflow, and inf * 0 is NaN in every masked sum.
    log_ratio = mx.where(mask > 0, logp - behaviour_logp, 0.0)
    ratio = mx.exp(log_ratio)

    if s.loss_type == "gspo":
        seq_log_ratio = _token_mean_per_sequence(log_ratio, mask)
        seq_ratio = mx.exp(seq_log_ratio)[:, None]
        per_token, clipped = _ppo_clip(seq_ratio, adv, s)  # (B, 1): one term per sequence
        per_token = mx.broadcast_to(per_token, logp.shape)
        clipped = mx.broadcast_to(clipped, logp.shape)
        ratio = mx.broadcast_to(seq_ratio, logp.shape)
    elif s.loss_type == "cispo":
        capped = mx.stop_gradient(mx.minimum(ratio, 1 + s.epsilon_high))
        per_token = -capped * adv * logp
        clipped = ratio > 1 + s.epsilon_high
    elif s.loss_type == "sapo":
        tau = mx.where(adv > 0, s.sapo_tau_pos, s.sapo_tau_neg)
        per_token = -(4 / tau) * mx.sigmoid(tau * (ratio - 1)) * adv
        clipped = mx.zeros(ratio.shape, dtype=mx.bool_)  # a soft gate clips nothing
    elif s.loss_type in PPO_CLIP_LOSSES:
        per_token, clipped = _ppo_clip(ratio, adv, s)
    else:
        raise ValueError(f"unknown loss_type {s.loss_type!r}; choose from {LOSS_TYPES}")
    if s.guide_shaping > 0 and guided is not None:
        # A reference was never sampled: its unlikely tokens would otherwise carry the largest steps
        # (on GSM8K one guided step turned every answer into a bare "#### N").
        p = mx.exp(logp)
        reference = guided.astype(mx.bool_)[:, None]
        per_token = mx.where(reference, -adv * p / (p + s.guide_shaping), per_token)
        clipped = clipped & ~reference

    if token_weight is not None:
        per_token = per_token * token_weight
    kl = None
    if s.beta > 0:
        kl_mask = sampled_tokens(mask, guided)
        kl = masked_k3(logp, ref_logp, kl_mask)
        per_token = per_token + s.beta * kl
    if s.entropy_coef > 0:
        per_token = per_token - s.entropy_coef * entropy

    token_sum = (per_token * mask).sum()
    if s.loss_type in ("grpo", "sapo", "gspo"):
        loss = _token_mean_per_sequence(per_token, mask).sum() / batch.num_sequences
    elif s.loss_type == "bnpo":
        loss = token_sum / mx.maximum(mask.sum(), 1) / batch.num_micro_batches
    elif s.loss_type == "dr_grpo":
        loss = token_sum / (batch.num_sequences * batch.max_tokens)
    else:  # dapo, cispo
        loss = token_sum / max(batch.num_tokens, 1)

    stats = {
        "tokens": mask.sum(),
        "clipped": (clipped * mask).sum(),
        "ratio": (mx.stop_gradient(ratio) * mask).sum(),
    }
    if kl is not None:
        stats["kl"] = mx.stop_gradient(kl).sum()
        stats["kl_tokens"] = kl_mask.sum()
    return loss, stats


def top_entropy_threshold(values, quantile: float) -> float:
    """The entropy at or above which the top `quantile` fraction of `values` (the tokens' entropies)
    lie: the ceil(quantile * n)-th largest. +inf when there are none."""
    values = np.sort(np.asarray(values, dtype=np.float32).reshape(-1))[::-1]
    if values.size == 0:
        return math.inf
    count = max(1, math.ceil(quantile * values.size - 1e-9))  # 0.7 * 10 is 7.000000000000001
    return float(values[count - 1])


def top_entropy_mask(entropy, mask, quantile: float, threshold: float | None = None):
    """1 on the tokens whose entropy is in the top `quantile` fraction of the masked tokens, else 0.

    "Beyond the 80/20 rule" (Wang et al. 2025, arXiv:2506.01939) trains only on
    the high-entropy "forking" tokens (the top 20%). The threshold is taken over
    these tokens unless given: the trainer gives the whole step's (step.py,
    top_entropy_weights), so the choice does not depend on how the step is cut
    into micro-batches. Ties at the threshold are kept.
    """
    entropy = mx.stop_gradient(entropy)
    if threshold is None:
        threshold = top_entropy_threshold(np.array(entropy)[np.array(mask) > 0], quantile)
    return ((entropy >= threshold) & (mask > 0)).astype(mx.float32)
