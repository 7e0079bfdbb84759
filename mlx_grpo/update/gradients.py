"""The loss's gradient, one micro-batch at a time, each prompt run once.

A micro-batch of whole groups runs its prompts, then their completions, and is
differentiated as one function of the weights.

A group cut into pieces (`batch.micro_batches`, to bound a CPU update's memory)
shares one prompt across its pieces. Running that prompt again in every piece
costs as many token passes as the piece's own completions when prompts are
long and pieces small (GSM8K: ~170-token prompts, pieces of one 200-token
completion). So the prompt runs once, outside the pieces:

    state = prompt_pass(weights)                     keys, values, last hidden state
    piece k: loss_k(weights, state)                  gradients dL_k/dweights and dL_k/dstate
    prompt:  sum_k dL_k/dweights  +  (sum_k dL_k/dstate) . dstate/dweights

The last term is one backward pass through the prompt, taken as the gradient of
sum(state * stop_gradient(summed state gradient)). By the chain rule the total
is exactly the gradient of running the prompt inside every piece
(tests/test_trainer.py checks it against whole groups). With dropout active
(lora_dropout > 0) the two prompt passes would draw different masks, so then
every piece runs its own prompt, as a whole micro-batch does.

Only the state of the layers that a trained weight can change is differentiated: with
adapters on the top k layers (lora_layers), the prompt's keys and values below them are
constants, and asking for their gradient would carry every piece's backward down through
all the layers the adapters leave alone.

On a CPU each piece's whole value-and-gradient is compiled (`_evaluated`): inside a traced
gradient `mx.compile` fuses nothing (measured; git history), so norms, RoPE,
SwiGLU and the softmax ran op by op forward and backward; compiled whole they fuse, the
gradients bit for bit the same (measured; git history). Every piece has its
own shapes, so each piece is compiled afresh: tracing and fusing it costs less than running it
unfused, and the fused kernels themselves are built once per process.
"""

from __future__ import annotations

import re
import warnings
from typing import Callable, Iterator

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..device import on_cpu
from .batch import MicroBatch, prompt_runs
from .logprobs import prompt_pass
from .recompute import needs_recompute, recomputed_layers

# (model, prompt_pass state, micro-batch) -> (log-probs, entropy) of its completion tokens
AfterPrompt = Callable[[nn.Module, tuple, MicroBatch], tuple[mx.array, mx.array]]
# (log-probs, entropy, micro-batch, reference log-probs or None) -> (loss, stats)
LossOf = Callable[[mx.array, mx.array, MicroBatch, mx.array | None], tuple[mx.array, dict]]

# Compile each piece's value-and-gradient whole on a CPU: 5-12% off the update at 0.5B (measured with it
# off and on in one process; scripts/profile_update.py --traced turns it off). Not on a GPU:
# there it is unmeasured, and first runs compile kernels.
COMPILE_ON_CPU = True
_fallback_reported = False  # the compiled update's fallback is reported once a process, with its first reason


def micro_batch_gradients(
    model: nn.Module, parts: list[MicroBatch], refs: list | None, after_prompt: AfterPrompt, loss_of: LossOf
) -> Iterator[tuple[mx.array, dict, dict]]:
    """(loss, stats, gradients) for each micro-batch, evaluated; each cut group adds one (0, {}, prompt's
    share)."""
    dropout = _dropout_active(model)
    # A compiled trace would hold one dropout mask as a constant: with dropout, run traced.
    compiled = COMPILE_ON_CPU and on_cpu() and not dropout
    # A compiled piece reads these as constants: one still a lazy graph over the weights (behaviour
    # log-probs just computed, say) would reach into the trace's inputs, which compile refuses.
    mx.eval(
        [[v for v in vars(mb).values() if isinstance(v, mx.array)] for mb in parts],
        [r for r in refs or [] if r is not None],
    )
    for run in prompt_runs(parts):
        run_refs = [refs[i] for i in run] if refs else [None] * len(run)
        # Completion passes too long to keep their activations recompute each layer (recompute.py).
        recompute = any(_needs_recompute(model, parts[i]) for i in run)
        if len(run) == 1 or dropout:
            for i, ref in zip(run, run_refs):
                yield _whole(model, parts[i], ref, after_prompt, loss_of, compiled, recompute)
        else:
            pieces = [parts[i] for i in run]
            yield from _pieces(model, pieces, run_refs, after_prompt, loss_of, compiled, recompute)


def _needs_recompute(model: nn.Module, mb: MicroBatch) -> bool:
    """Whether the micro-batch's completion pass, attending to its prompt, recomputes its layers."""
    rows, width = mb.completions.shape
    return needs_recompute(model, rows, width, context=mb.prompts.shape[1] + width)


def _dropout_active(model: nn.Module) -> bool:
    return any(
        isinstance(m, nn.Dropout) and m.training and getattr(m, "_p_1", 1.0) < 1 for m in model.modules()
    )


def _evaluated(model: nn.Module, fn: Callable, compiled: bool, *args, recompute: bool = False) -> tuple:
    """`fn(*args)` = (loss, stats, *gradients), evaluated; `compiled`: with `fn` compiled whole;
    `recompute`: with the model's layers recomputed in the backward pass (recompute.py).

    Compiled afresh for every call: a call with new shapes traces anew anyway, and this way no
    trace is kept from one piece to the next, so what a piece reads besides its arguments (its
    micro-batch, the shared prompt's state) is safely a constant of its trace."""
    with recomputed_layers(model, recompute):
        return _evaluated_as_is(model, fn, compiled, *args)


def _evaluated_as_is(model: nn.Module, fn: Callable, compiled: bool, *args) -> tuple:
    if compiled:
        names = []

        def packed(*args):
            loss, stats, *gradients = fn(*args)
            names.extend(stats)
            # The statistics leave as one array: MLX 0.32's compile fails (`_Map_base::at`) on an
            # output that another output or a node of the loss also computes (bnpo's token count,
            # mask.sum(), is both a statistic and its divisor).
            return (loss, *([mx.stack([stats[k] for k in names])] if names else []), *gradients)

        weights = model.parameters()
        try:
            loss, *rest = mx.compile(packed, inputs=[model.state], outputs=[model.state])(*args)
            stats = dict(zip(names, rest.pop(0))) if names else {}
            mx.eval(loss, stats, rest)
            return (loss, stats, *rest)
        except Exception as error:  # noqa: BLE001 (the traced run below is the reference; it raises what is real)
            # A trace that fails leaves its placeholders in the model: put the weights back first.
            model.update(weights)
            _report_fallback(error)
    out = fn(*args)
    mx.eval(out)
    return out


def _report_fallback(error: Exception) -> None:
    """Say once, at warning level, that the update runs traced and why: it is correct but slower."""
    global _fallback_reported
    if not _fallback_reported:
        warnings.warn(
            f"compiling the update's value and gradient failed ({type(error).__name__}: {error}); "
            "running it traced (the same gradients, slower)",
            stacklevel=3,
        )
        _fallback_reported = True  # after the warning: where warnings are errors (the suite), each one raises


def _whole(
    model, mb: MicroBatch, ref, after_prompt: AfterPrompt, loss_of: LossOf, compiled: bool, recompute: bool
):
    def loss_fn(model):
        state = prompt_pass(model, mb.prompts, mb.left_padding)
        logp, entropy = after_prompt(model, state, mb)
        return loss_of(logp, entropy, mb, ref)

    def value_and_grad():
        (loss, stats), grads = nn.value_and_grad(model, loss_fn)(model)
        return loss, stats, grads

    return _evaluated(model, value_and_grad, compiled, recompute=recompute)


def _flat_state(state) -> list[mx.array]:
    keys, values, last = state
    return [*keys, *values, last]


def _state_of(flat: list[mx.array]):
    layers = (len(flat) - 1) // 2
    return flat[:layers], flat[layers : 2 * layers], flat[-1]


def lowest_trained_layer(model: nn.Module) -> int:
    """The lowest layer holding a trained weight; 0 when a trained weight sits outside the layers.

    The prompt's keys and values below this layer depend on no trained weight. A weight outside
    `layers` (a trained embedding, say) may feed every layer, so then none is taken as constant.
    """
    lowest = len(model.layers)
    for name, _ in tree_flatten(model.trainable_parameters()):
        found = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
        if found is None:
            return 0
        lowest = min(lowest, int(found.group(1)))
    return lowest


def _varying(flat_size: int, lowest: int) -> list[int]:
    """Indices into a flat prompt state (keys per layer, values per layer, last) that trained weights
    change."""
    layers = (flat_size - 1) // 2
    return [i for i in range(flat_size) if i == flat_size - 1 or i % layers >= lowest]


def _with_varying(state: list[mx.array], varying: list[int], values: list[mx.array]) -> list[mx.array]:
    """The flat prompt state with its `varying` entries replaced by `values` (the traced ones)."""
    flat = list(state)
    for i, value in zip(varying, values):
        flat[i] = value
    return flat


def _pieces(
    model,
    pieces: list[MicroBatch],
    refs: list,
    after_prompt: AfterPrompt,
    loss_of: LossOf,
    compiled: bool,
    recompute: bool,
):
    first = pieces[0]
    state = _flat_state(prompt_pass(model, first.prompts, first.left_padding))
    mx.eval(state)
    varying = _varying(len(state), lowest_trained_layer(model))
    state_grads = None
    for mb, ref in zip(pieces, refs):

        def value_and_grad(varying_state, mb=mb, ref=ref):
            def piece_loss(params, varying_state):
                model.update(params)
                logp, entropy = after_prompt(
                    model, _state_of(_with_varying(state, varying, varying_state)), mb
                )
                return loss_of(logp, entropy, mb, ref)

            params = model.trainable_parameters()
            (loss, stats), (grads, grads_of_state) = mx.value_and_grad(piece_loss, argnums=(0, 1))(
                params, varying_state
            )
            model.update(params)  # the weights themselves, not the traced copies
            return loss, stats, grads, grads_of_state

        loss, stats, grads, grads_of_state = _evaluated(
            model, value_and_grad, compiled, [state[i] for i in varying], recompute=recompute
        )
        state_grads = (
            grads_of_state if state_grads is None else [a + b for a, b in zip(state_grads, grads_of_state)]
        )
        mx.eval(state_grads)
        yield loss, stats, grads

    def through_prompt(model):  # its gradient is the summed state gradient carried back through the prompt
        again = _flat_state(prompt_pass(model, first.prompts, first.left_padding))
        return sum((again[i] * g).sum() for i, g in zip(varying, state_grads))

    def prompt_grads():
        return mx.array(0.0), {}, nn.value_and_grad(model, through_prompt)(model)[1]

    yield _evaluated(model, prompt_grads, compiled)
