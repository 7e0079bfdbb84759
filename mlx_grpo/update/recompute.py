"""Layers recomputed in the backward pass, for passes too long to keep their activations.

A backward pass needs what each layer computed on the way forward: at 0.5B about
5 GB for one web episode of ~1,100 tokens, most of it the attention's scores,
which grow with the square of the length. Cutting a micro-batch into rows
(batch.memory_bound_size) stops at one row; past that, each transformer layer
runs under `mx.checkpoint`, which keeps only the layer's input and works the
rest out again, one layer at a time, when the backward pass reaches it. That
costs one more forward pass through the layers and changes no value: the same
operations run on the same inputs.

It is used where a pass's estimated activations (kept_activation_bytes) would
exceed the memory budget the decode uses (models/memory.py: a quarter of the
memory free, or MLX_GRPO_DECODE_MEMORY_GB): on a large machine only the longest
episodes pay for it, on a small one every pass that would not fit.

`mx.checkpoint` passes gradients only to its arguments, so everything a layer is
differentiated through goes in as one: the layer's trainable weights, its input,
and the prompt's keys and values a completion pass attends to. A pass that writes
a cache (the prompt pass that fills it) runs as it is.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator

import mlx.core as mx
import mlx.nn as nn

from ..models.memory import memory_budget


def kept_activation_bytes(
    model: nn.Module, rows: int, positions: int, context: int | None = None
) -> int | None:
    """A float32 estimate of what a pass of `rows` x `positions`, attending to `context` positions
    (its own and a prompt's before them; default: its own), keeps for the backward pass through its
    layers (None: shape unknown).

    Per position and layer, the MLP's four intermediates (gate, up, their activation and product)
    and about 12 vectors of the hidden size (norms, queries, keys, values, attention output,
    residuals, adapters); per head and layer, two score matrices of positions x context (the
    attention's scores and their softmax), which make most of a long episode's."""
    args = getattr(model, "args", None)
    try:
        layers, hidden, heads = args.num_hidden_layers, args.hidden_size, args.num_attention_heads
        per_position = 4 * args.intermediate_size + 12 * hidden
    except (AttributeError, TypeError):
        return None
    context = positions if context is None else context
    return 4 * rows * layers * (per_position * positions + 2 * heads * positions * context)


def needs_recompute(
    model: nn.Module, rows: int, positions: int, context: int | None = None, budget: int | None = None
) -> bool:
    """Whether a pass (kept_activation_bytes' arguments) would keep more than the budget allows."""
    kept = kept_activation_bytes(model, rows, positions, context)
    if not kept:
        return False
    budget = memory_budget() if budget is None else budget
    return kept > budget


def _pure_cache(cache) -> bool:
    """A cache a layer only reads from (the prompt's keys and values, set before the pass)."""
    return getattr(cache, "keys", None) is not None and getattr(cache, "offset", 0) > 0


def _recomputed_call(original):
    def call(self, x, mask=None, cache=None):
        if cache is not None and not _pure_cache(cache):
            return original(self, x, mask, cache)
        read_only = [] if cache is None else [cache.keys, cache.values]

        def layer(params, x, *keys_values):
            self.update(params)
            local = None
            if cache is not None:  # the same cache over the traced keys and values
                local = copy.copy(cache)
                local.keys, local.values = keys_values
            return original(self, x, mask, local)

        return mx.checkpoint(layer)(self.trainable_parameters(), x, *read_only)

    return call


@contextmanager
def recomputed_layers(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Inside, every transformer layer of `model` is recomputed in the backward pass (see above)."""
    kinds = {type(layer) for layer in getattr(model, "layers", [])} if enabled else set()
    originals = {kind: kind.__dict__.get("__call__") for kind in kinds}
    try:
        for kind in kinds:
            kind.__call__ = _recomputed_call(kind.__call__)
        yield
    finally:
        for kind, original in originals.items():
            if original is None:  # it was inherited: inherit it again
                del kind.__call__
            else:
                kind.__call__ = original
