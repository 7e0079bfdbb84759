"""The middle of a GRPO step: what it trains on, and its update made ready.

`choose_trained` takes the groups collect_rollouts kept (`StepRollouts.keep`,
step_rollouts.py: the one decision of which groups are trained) and gives their
completions, their group-baseline advantages and where each sits among the
step's sampled completions (the records say which were trained).

`prepare_update` builds the batch and everything update() needs:
  - the micro-batch size (bnpo's is part of its objective; the others' is
    bounded by the CPU's activation memory, update/batch.py);
  - the micro-batches, without the groups that carry no signal when no KL or
    entropy term would still train them (`groups_with_signal`), this rank's share;
    a group cut into pieces has its rows ordered by length first where the loss
    allows (`same_at_any_cut`), and the padded share of their slots is logged;
  - the reference's log-probs when the loss needs them, and the KL to it when
    only watched (over every group);
  - whether the step carries any signal at all, and `entropy_top_quantile`'s
    token weights, chosen over the whole step.

`apply_update` takes the prepared update to the optimizer (update/step.py) and
gives what a step logs of it. train's step and the API's Trainer.update (groups
a user sampled and scored, shaped and filtered by shaping.py's step_rewards,
then `kept_groups`) both go this one way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import TrainConfig
from ..models.run_models import is_run_folder
from ..tasks.registry import Task, token_budget
from ..update.advantages import group_advantages
from ..update.batch import (
    MicroBatch,
    RolloutBatch,
    batch_shape,
    build_batch,
    carries_signal,
    groups_with_signal,
    memory_bound_size,
    micro_batches,
    padded_fraction,
)
from ..update.losses import BatchShape, LossSettings, masked_k3, same_at_any_cut, sampled_tokens
from ..update.step import UpdateSettings, reference_logprobs, top_entropy_weights, update
from . import distributed as dist
from .guidance import without_guided_negatives
from .step_rollouts import StepRollouts

# Chunk the vocabulary projection when one micro-batch's logits would exceed this many floats.
_CHUNK_LOGITS_ABOVE = 2**27


def head_chunk(setting: int | None, model, rows: int, positions: int) -> int | None:
    """Positions per vocabulary-projection chunk for a micro-batch of `rows` x `positions` scored tokens.

    The setting when given; else 128 once the micro-batch's logits would pass _CHUNK_LOGITS_ABOVE
    floats, and None (no chunking) below that. GRPO's update and sft's step both follow it.
    """
    if setting:
        return setting
    vocab = model.model.embed_tokens.weight.shape[0] if hasattr(model, "model") else 0
    return 128 if rows * positions * vocab > _CHUNK_LOGITS_ABOVE else None


def logprob_chunk(config: TrainConfig, model, batch: RolloutBatch, size: int) -> int | None:
    """head_chunk for micro-batches of `size` rows of `batch`."""
    return head_chunk(
        config.logprob_chunk_size, model, min(size, len(batch.advantages)), batch.completions.shape[1]
    )


def update_settings(config: TrainConfig) -> UpdateSettings:
    """The update's settings: the objective group, the sampling temperature and the gradient clip."""
    o = config.objective
    loss = LossSettings(
        loss_type=o.loss,
        epsilon_low=o.epsilon_low,
        epsilon_high=o.epsilon_high,
        delta=o.delta,
        beta=o.beta,
        sapo_tau_pos=o.sapo_tau_pos,
        sapo_tau_neg=o.sapo_tau_neg,
        entropy_coef=o.entropy_coef,
        guide_shaping=config.guide_shaping,
    )
    return UpdateSettings(
        loss,
        config.sampling.temperature,
        o.num_iterations,
        config.max_grad_norm,
        o.entropy_coef,
        o.entropy_top_quantile,
    )


@dataclass
class Trained:
    """The completions a step trains on: those of its kept groups, in sampling order."""

    completions: list
    advantages: np.ndarray  # one a completion: its group's baseline advantage
    positions: np.ndarray  # where each sits among the step's sampled completions

    def advantage_of(self) -> dict[int, float]:
        """Sampled position -> advantage, for the trained completions only."""
        return dict(zip(self.positions, self.advantages))


def choose_trained(sampled: StepRollouts, config: TrainConfig) -> Trained:
    return kept_groups(sampled.completions, sampled.rewards, sampled.keep, config)


def kept_groups(completions: list, rewards: np.ndarray, keep: np.ndarray, config: TrainConfig) -> Trained:
    """The completions of the groups `keep` marks (one bool a group of `config.group_size`), with their
    advantages from `rewards` (shaped: shaping.py's step_rewards). train's step and the API's Trainer.update
    both choose this way."""
    kept_rows = np.repeat(keep, config.group_size)
    trained = [c for c, k in zip(completions, kept_rows) if k]
    return Trained(
        trained, group_baselines(trained, np.asarray(rewards)[kept_rows], config), np.flatnonzero(kept_rows)
    )


def group_baselines(completions: list, rewards: np.ndarray, config: TrainConfig) -> np.ndarray:
    """Each completion's advantage in its group of `config.group_size`, scaled as the run's settings say."""
    g = config.group_size
    advantages = group_advantages(rewards, g, config.objective.scale_rewards, config.objective.scale_eps)
    if config.guide and not config.guide_negatives:
        advantages = without_guided_negatives(
            advantages, [getattr(c, "guided", False) for c in completions], g
        )
    return advantages


@dataclass
class PreparedUpdate:
    """What update() takes for one step, and what the step logs about it."""

    sizes: BatchShape  # the loss's normalisers
    parts: list[MicroBatch]  # this rank's micro-batches
    ref_logps: list | None  # the reference's log-probs of them (beta > 0)
    chunk: int | None  # positions per vocabulary-projection chunk
    token_weights: list | None  # entropy_top_quantile's chosen tokens
    no_signal: bool  # no token trained, or no advantage on one and no KL or entropy term
    skip: bool  # skip_no_signal on a step without signal: the optimizer does not step
    kl: (
        float | None
    )  # KL to the reference, when watched this step (0 at step 1 from the base); None: not measured
    prompt_tokens: int  # prompt tokens in the update, for train/tokens_per_s
    padded_frac: float | None = (
        None  # update/padded_frac: padding's share of every rank's micro-batches' slots
    )


def _kl_to_reference(parts: list[MicroBatch], ref_logps) -> float | None:
    """Mean k3 KL of the sampling policy to the reference, from the behaviour log-probs of its samples.

    With beta = 0 the loss has no KL term; this keeps KL visible anyway.
    """
    sums = {"total": 0.0, "count": 0.0}
    for mb, ref in zip(parts, ref_logps):
        mask = sampled_tokens(mb.mask, mb.guided)
        sums["total"] += masked_k3(mb.behaviour_logp, ref, mask).sum().item()
        sums["count"] += mask.sum().item()
    sums = dist.sum_across_ranks(sums)  # each rank passes its share of the micro-batches
    return sums["total"] / sums["count"] if sums["count"] else None  # no sampled token: nothing to measure


def prepare_update(
    model, trained: Trained, task: Task, config: TrainConfig, step: int, ref_params
) -> PreparedUpdate:
    """The batch of the trained completions, cut into this rank's micro-batches, with what the loss needs."""
    o = config.objective
    # Step 1 samples from the starting weights: the reference itself (KL 0) unless the run continues
    # another run's adapters (a warm start, a run folder as the model), whose distance is measured then.
    continued_start = step == 1 and is_run_folder(config.model)
    kl = 0.0 if step == 1 and o.kl_every > 0 and not continued_start else None
    completions, g = trained.completions, config.group_size
    if (
        not completions
    ):  # every group was filtered out: zero gradients (the optimizer steps on them unless skip_no_signal)
        return PreparedUpdate(
            BatchShape(0, 0, 0, config.sampling.max_tokens),
            [],
            None,
            None,
            [],
            True,
            config.skip_no_signal,
            kl,
            0,
        )
    batch = build_batch(completions, trained.advantages, g)
    if config.mask_truncated:  # cut-off completions contribute no token to the loss
        batch.mask[[c.truncated for c in completions]] = 0.0
    # bnpo normalises per micro-batch, so its size is part of the objective; the others are exact at any size.
    size = (
        config.micro_batch_size
        if o.loss == "bnpo"
        else memory_bound_size(config.micro_batch_size, model, batch.completions.shape[1])
    )
    chunk = logprob_chunk(config, model, batch, size)
    # The reference costs a forward pass: every step when the loss needs it,
    # every kl_every steps when it is only watched.
    watch_kl = o.beta == 0 and o.kl_every > 0 and (step % o.kl_every == 0 or continued_start)
    # A zero-advantage group adds nothing to the loss unless a KL or entropy term
    # does; bnpo divides by each micro-batch's own token count, so its micro-batches stay whole.
    skip_silent = o.beta == 0 and o.entropy_coef == 0 and o.loss != "bnpo"
    by_length = same_at_any_cut(o.loss)  # a cut group's rows of similar length share a piece
    parts = micro_batches(groups_with_signal(batch) if skip_silent else batch, size, by_length)
    sizes = batch_shape(batch, size, token_budget(task, config), by_length)
    padded = padded_fraction(parts)  # over the step's trained micro-batches, before they are shared out
    if watch_kl:  # over every group, silent ones included
        all_parts = micro_batches(batch, size, by_length) if skip_silent else parts
        mine = [all_parts[i] for i in dist.shard(len(all_parts))]
        kl = _kl_to_reference(
            mine, reference_logprobs(model, mine, ref_params, config.sampling.temperature, chunk)
        )
    parts = [parts[i] for i in dist.shard(len(parts))]  # data-parallel: this rank's micro-batches
    # No signal: no token trained at all, or no advantage on a trained token and no KL or entropy term;
    # the gradient is zero either way.
    no_signal = not batch.mask.any() or (o.beta == 0 and o.entropy_coef == 0 and not carries_signal(batch))
    skip = config.skip_no_signal and no_signal
    ref_logps = (
        reference_logprobs(model, parts, ref_params, config.sampling.temperature, chunk)
        if o.beta > 0 and not skip
        else None
    )
    weights = None  # entropy_top_quantile: the tokens that carry the loss, chosen over the whole step
    if o.entropy_top_quantile < 1 and not skip:
        silent = micro_batches(groups_with_signal(batch, silent=True), size, by_length) if skip_silent else []
        weights = top_entropy_weights(
            model,
            parts,
            [silent[i] for i in dist.shard(len(silent))],
            o.entropy_top_quantile,
            config.sampling.temperature,
            chunk,
            dist.all_gather_objects,
        )
    return PreparedUpdate(
        sizes, parts, ref_logps, chunk, weights, no_signal, skip, kl, sum(map(len, batch.prompts)), padded
    )


def apply_update(model, optimizer, ready: PreparedUpdate, config: TrainConfig) -> dict:
    """The prepared update's optimizer steps (none when `ready.skip`), and what a step logs of them.

    The one way from a prepared update to the weights: train's step and the API's Trainer.update both take it.
    """
    metrics = {"kl": ready.kl}  # kl None: not measured this step; a loss with beta > 0 reports its own
    metrics.update(
        update(
            model,
            optimizer,
            update_settings(config),
            ready.sizes,
            ready.parts,
            ready.ref_logps,
            ready.chunk,
            dist.all_sum_tree,
            dist.sum_across_ranks,
            skip=ready.skip,
            token_weights=ready.token_weights,
        )
    )
    metrics["update/no_signal"] = ready.no_signal
    metrics["update/padded_frac"] = (
        ready.padded_frac
    )  # padding's share of the micro-batches' completion slots
    # The rate the last update used (absent only if every update so far was skipped).
    metrics["lr"] = optimizer.state["learning_rate"].item() if "learning_rate" in optimizer.state else None
    return metrics
