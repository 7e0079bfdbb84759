"""One rollout batch's optimizer steps, and the reference pass they may need.

The trainer (run/trainer.py) builds the micro-batches and calls these; so does
the Python API's Trainer.update. What the loss is lives in losses.py, how a
micro-batch's gradient is taken in gradients.py; here they meet the optimizer:
`num_iterations` steps over the same batch (mu in the GRPO paper), gradients
summed over micro-batches (and over ranks, when data-parallel), clipped by
their global norm, and a step that is not finite skipped whole.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from ..models.adapters import adapters_disabled, weights_swapped
from .batch import MicroBatch, prompt_runs
from .gradients import micro_batch_gradients
from .logprobs import logprobs_after_prompt, prompt_pass, scored_positions
from .losses import BatchShape, LossSettings, policy_loss, top_entropy_mask, top_entropy_threshold


@dataclass
class UpdateSettings:
    """The update's part of a run's settings, each given (run/step_update.py's update_settings builds it
    from the config's groups): no default here, the settings' defaults are setting_groups.py's."""

    loss: LossSettings
    temperature: float  # log-probs at the sampling temperature
    num_iterations: int  # optimizer steps on one rollout batch
    max_grad_norm: float
    entropy_coef: float  # > 0: the entropy bonus is optimised, so it needs its gradient
    entropy_top_quantile: float  # < 1: only the highest-entropy tokens carry the loss


def relative_change(before, after) -> float:
    """||after - before|| / ||before|| over every array of two parameter trees of the same shape."""
    old, new = dict(tree_flatten(before)), dict(tree_flatten(after))
    diff = sum((mx.sum(mx.square(new[k] - v)) for k, v in old.items()), mx.array(0.0)).item()
    norm = sum((mx.sum(mx.square(v)) for v in old.values()), mx.array(0.0)).item()
    return math.sqrt(diff / norm) if norm > 0 else math.inf if diff > 0 else 0.0


def reference_logprobs(
    model, parts: list[MicroBatch], ref_params, temperature: float, chunk
) -> list[mx.array]:
    """log pi_ref of the completion tokens, per micro-batch: the base model (adapters off) or frozen weights.

    In eval mode, whatever the model's mode outside: the reference is a fixed policy, never one
    with a fresh LoRA dropout mask (a refreshed reference keeps its adapters and their dropout)."""
    context = weights_swapped(model, ref_params) if ref_params is not None else adapters_disabled(model)
    with _eval_mode(model), context:
        return [logp for logp, _ in _passes(model, parts, temperature, chunk)]


def top_entropy_weights(
    model,
    parts: list[MicroBatch],
    others: list[MicroBatch],
    quantile: float,
    temperature: float,
    chunk,
    gather: Callable = lambda values: [values],
) -> list[mx.array]:
    """Which tokens of `parts` carry the loss (entropy_top_quantile < 1): 1 where a token's entropy is in
    the top `quantile` of the whole step's tokens, else 0.

    The threshold is taken over the masked tokens of `parts` and of `others` (micro-batches not trained
    on but part of the step: groups with no signal, skipped for speed), on every rank (`gather(values)`
    returns each rank's), so the choice does not depend on the micro-batch size, on skipping silent
    groups, or on the number of processes. Chosen once per step, in eval mode: every one of
    num_iterations updates trains the same tokens."""
    with _eval_mode(model):
        entropies = [entropy for _, entropy in _passes(model, parts + others, temperature, chunk)]
    mine = [np.array(e)[np.array(mb.mask) > 0] for e, mb in zip(entropies, parts + others)]
    threshold = top_entropy_threshold(np.concatenate(gather(np.concatenate(mine or [np.zeros(0)]))), quantile)
    return [top_entropy_mask(e, mb.mask, quantile, threshold) for e, mb in zip(entropies, parts)]


@contextmanager
def _eval_mode(model):
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _passes(model, parts: list[MicroBatch], temperature: float, chunk):
    """(log-probs, entropy) of each micro-batch's completion tokens, no gradient; each prompt run once.

    Only the masked-in tokens are scored; the others read 0, and every reader weighs them by the mask."""
    for run in prompt_runs(parts):  # the pieces of a group share its prompt pass
        state = prompt_pass(model, parts[run[0]].prompts, parts[run[0]].left_padding)
        for mb in (parts[i] for i in run):
            logp, entropy = logprobs_after_prompt(
                model,
                state,
                mb.left_padding,
                mb.completions,
                mb.group_size,
                temperature,
                chunk,
                positions=scored_positions(mb.mask),
            )
            mx.eval(logp, entropy)
            yield mx.stop_gradient(logp), mx.stop_gradient(entropy)


def _skipped(count: int, nonfinite: int) -> dict:
    """A skipped update is an optimizer step not taken (weights, Adam's moments and the schedule left as they
    were), whether for a step without signal (skip) or for a NaN/Inf loss or gradient: `skipped_updates`
    counts them among the step's num_iterations, `update/skipped` says whether there was one,
    `update/nonfinite` counts those skipped for a NaN/Inf (the health rule `nonfinite` reads it)."""
    return {"skipped_updates": count, "update/skipped": count > 0, "update/nonfinite": nonfinite}


def update(
    model,
    optimizer,
    config: UpdateSettings,
    sizes: BatchShape,
    parts: list[MicroBatch],
    ref_logps,
    chunk,
    all_sum_tree: Callable = lambda tree: tree,
    sum_across_ranks: Callable = lambda sums: sums,
    skip: bool = False,
    token_weights: list[mx.array] | None = None,
) -> dict:
    """`num_iterations` optimizer steps on one rollout batch. Returns averaged statistics.

    `sizes` describes the whole batch (normalisation); `parts` may leave out
    groups that contribute nothing (see groups_with_signal). Data-parallel
    training passes the sums over ranks (run/distributed.py); one process
    needs none. `skip` (a batch with no signal, under skip_no_signal): no
    optimizer step at all, so neither the weights, Adam's moments nor the
    schedule move. `token_weights`, one per part, are the tokens that carry the
    policy term (entropy_top_quantile < 1): the trainer's, taken over the whole
    step (top_entropy_weights); without them, over `parts`.
    """
    if skip:
        return {
            "loss": 0.0,
            "grad_norm": 0.0,
            "grad_norm/max": 0.0,
            "grad_clipped": False,
            "grad_clipped_frac": 0.0,
            "clip_fraction": None,
            "ratio/mean": None,
            "entropy": None,
            "update/rel_change": 0.0,
            **_skipped(config.num_iterations, nonfinite=0),
        }
    settings = config.loss

    def after_prompt(model, state, mb: MicroBatch):
        # Only the tokens in the loss go through the output head. The mask is an evaluated constant
        # (gradients.micro_batch_gradients), so inside a compiled piece their count is a fixed shape.
        return logprobs_after_prompt(
            model,
            state,
            mb.left_padding,
            mb.completions,
            mb.group_size,
            config.temperature,
            chunk,
            entropy_grad=config.entropy_coef > 0,
            differentiated=True,
            positions=scored_positions(mb.mask),
        )

    if config.entropy_top_quantile < 1 and token_weights is None:
        token_weights = top_entropy_weights(
            model, parts, [], config.entropy_top_quantile, config.temperature, chunk
        )
    weight_of = {id(mb): w for mb, w in zip(parts, token_weights)} if token_weights is not None else {}

    def loss_of(logp, entropy, mb: MicroBatch, ref):
        keep = weight_of.get(id(mb))
        loss, stats = policy_loss(
            logp,
            mb.behaviour_logp,
            mb.advantages,
            mb.mask,
            sizes,
            settings,
            ref_logp=ref,
            entropy=entropy,
            token_weight=keep,
            guided=mb.guided,
        )
        stats["entropy"] = (mx.stop_gradient(entropy) * mb.mask).sum()
        return loss, stats

    totals: dict[str, float] = {}
    losses, norms, clipped, skipped = [], [], [], 0
    start_weights = model.trainable_parameters()  # for the update size (health rule lr_too_low)
    for _ in range(config.num_iterations):
        # Zero gradients when no group carries signal: unless told to skip, the optimizer still
        # steps (as on an all-zero batch), and Adam's moments move the weights.
        grads = tree_map(mx.zeros_like, model.trainable_parameters()) if not parts else None
        sums = {"loss": 0.0}
        for loss, stats, g in micro_batch_gradients(model, parts, ref_logps, after_prompt, loss_of):
            grads = g if grads is None else tree_map(mx.add, grads, g)
            mx.eval(grads)
            sums["loss"] += loss.item()
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v.item()
        # Data-parallel: add the other ranks' micro-batches (a no-op with one process).
        grads = all_sum_tree(grads)
        sums = sum_across_ranks(sums)
        loss_sum = sums.pop("loss")
        for k, v in sums.items():
            totals[k] = totals.get(k, 0.0) + v
        grads, norm = optim.clip_grad_norm(grads, config.max_grad_norm)
        norm = norm.item()
        if not math.isfinite(norm) or not math.isfinite(loss_sum):
            skipped += 1  # a NaN/Inf step would poison the weights: leave them untouched
        else:
            optimizer.update(model, grads)
            mx.eval(model.trainable_parameters(), optimizer.state)
        losses.append(loss_sum)
        norms.append(norm)
        clipped.append(norm > config.max_grad_norm)
    tokens = totals.get("tokens", 0.0)
    metrics = {
        "loss": float(np.mean(losses)),
        "grad_norm": float(norms[-1]),
        "grad_norm/max": float(np.max(norms)),
        "grad_clipped": bool(clipped[-1]),
        "grad_clipped_frac": float(np.mean(clipped)),
        # Token statistics cover the tokens trained on; none when every group was silent.
        "clip_fraction": totals["clipped"] / tokens if tokens else None,
        "ratio/mean": totals["ratio"] / tokens if tokens else None,
        "entropy": totals["entropy"] / tokens if tokens else None,
        "update/rel_change": relative_change(start_weights, model.trainable_parameters()),
        **_skipped(skipped, nonfinite=skipped),
    }
    if totals.get("kl_tokens"):
        metrics["kl"] = totals["kl"] / totals["kl_tokens"]
    return metrics
