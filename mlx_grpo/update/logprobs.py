"""Log-probabilities of completion tokens under the policy (or the reference).

Two ways to the same numbers:

- `token_logprobs(model, tokens)`: one forward pass over whole sequences.
- `completion_logprobs(...)`: the GRPO shape. The G completions of a prompt
  share it, so the prompt runs through the model once and its keys and values
  are shared by all G completions (through a small cache object that mlx-lm's
  attention layers accept). With arith prompts of ~30 tokens and completions
  of ~12 this does 2.5x fewer token-forwards; gradients flow into the shared
  prompt positions exactly as they would through G separate copies.

Prompts in one call are left-padded to a common length, with padded key
positions masked out; RoPE attention depends on relative positions only, so
the padding does not change the result.

Both can apply the vocabulary projection a chunk of positions at a time under
`mx.checkpoint`, so no (batch, length, vocab) float32 tensor is kept for the
backward pass: with a 150k vocabulary that tensor alone is gigabytes. Through a
frozen head (LoRA) a differentiated call does better still: each position's
gradient with respect to its hidden state is worked out while the softmax is
at hand (`_through_frozen_head`), so the backward pass runs no head at all.

A taken token's log-prob is its logit less the log-normaliser, read with a gather; its gradient
with respect to the logits (the taken token's one-hot less the softmax, times the cotangent) is one
pass over the vocabulary (`_taken_slope`), in the backward pass of a trainable head and in the
forward pass of a frozen one: no (positions x vocabulary) log-softmax is formed, and no one-hot is
scattered into a vocabulary-wide array of zeros.

Given `positions` (`scored_positions` of the completion mask), only those positions' hidden
states go through the head: in a multi-turn episode most completion tokens are observations
the environment wrote (mask 0), and the head (a 150k-word matmul, its softmax and gradient)
costs per position about a third of a 0.5B model's whole body. Their log-probs and entropies
are put back in the (B, K) layout with 0 at every other position.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from ..models.heads import output_head


def _softmax_terms(logits, temperature):
    """(scaled logits z, exp(z - shift), their sum, log-normaliser) of the softmax at `temperature`.

    One exp over the vocabulary serves the log-normaliser, the entropy and the backward pass
    (exp keeps its output for its gradient; mx.logsumexp and mx.softmax would each take their
    own). On a CPU (rows, positions, 150k) logits are hundreds of millions of exps.
    """
    if logits.dtype in (mx.float16, mx.bfloat16):  # softmax in half precision loses the tails
        logits = logits.astype(mx.float32)
    z = logits / temperature
    shift = mx.stop_gradient(mx.max(z, axis=-1, keepdims=True))
    weights = mx.exp(z - shift)
    total = weights.sum(axis=-1, keepdims=True)
    return z, weights, total, (mx.log(total) + shift).squeeze(-1)


def _taken_slope(weights, total, targets, scale):
    """scale x (onehot(target) - weights / total): the gradient of scale x log softmax(z)[target] with respect
    to z, given softmax(z) = weights / total. One pass over the vocabulary makes the softmax term; the taken
    entries are then written into that fresh array in place (a scatter that takes over its input's buffer:
    one write per position, no vocabulary-wide one-hot or zeros array)."""
    scale = scale[..., None]
    slope = weights * (-scale / total)
    taken = scale * (1 - mx.take_along_axis(weights, targets[..., None], axis=-1) / total)
    return mx.put_along_axis(slope, targets[..., None], taken.astype(slope.dtype), axis=-1)


@mx.custom_function
def _taken(z, targets, weights, total, lse):
    """z[target] - lse, differentiated with respect to z alone: `weights`, `total` and `lse` are z's softmax
    terms (_softmax_terms), passed in under stop_gradient so that the backward pass reuses the forward's
    exp instead of differentiating through it (or running it again)."""
    return mx.take_along_axis(z, targets[..., None], axis=-1).squeeze(-1) - lse


@_taken.vjp
def _taken_vjp(primals, cotangent, output):
    z, targets, weights, total, lse = primals
    slope = _taken_slope(weights, total, targets, cotangent.astype(weights.dtype)).astype(z.dtype)
    # The other primals are stop_gradient's outputs: their zeros are never evaluated.
    return slope, mx.zeros_like(targets), mx.zeros_like(weights), mx.zeros_like(total), mx.zeros_like(lse)


def _taken_logprobs(z, targets, weights, total, lse):
    """log softmax(z)[target], gathered; its gradient is one pass over the vocabulary (_taken_slope)."""
    return _taken(z, targets, mx.stop_gradient(weights), mx.stop_gradient(total), mx.stop_gradient(lse))


def _logprobs_and_entropy(logits, targets, temperature, entropy_grad=False, with_entropy=True):
    """(log-probs of `targets`, entropies) at `temperature`. `entropy_grad`: an entropy bonus differentiates
    the entropy too. `with_entropy=False` (sft's loss): no entropy is worked out, and zeros stand for it."""
    z, weights, total, lse = _softmax_terms(logits, temperature)
    logp = _taken_logprobs(z, targets, weights, total, lse)
    if not with_entropy:
        return logp, mx.zeros_like(logp)
    if entropy_grad:  # an entropy bonus optimises it
        entropy = lse - mx.sum((weights / total) * z, axis=-1)
        return logp, entropy
    # Otherwise entropy is only watched: keep it out of the backward pass.
    probs = mx.stop_gradient(weights / total)
    entropy = mx.stop_gradient(lse) - mx.sum(probs * mx.stop_gradient(z), axis=-1)
    return logp, entropy


# At most this many logits in one chunk: each chunk holds a few such float32
# tensors (logits, softmax, their gradients) at once.
_CHUNK_FLOATS = 2**24


def _through_frozen_head(project, hidden, targets, temperature, chunk_size):
    """Log-probs and entropy through a head with no trained weight, for a caller that differentiates them.

    A log-prob depends on its own position's hidden state alone, through the head W:

        d logp_t / d h_t = (W[target_t] - sum_v p_tv W_v) / T

    a vector of the hidden size, worked out here from the softmax while it is at hand (one
    matmul: the head's backward). Then the log-prob is returned as

        logp_t + (h_t . J_t - stop_gradient(h_t . J_t))

    whose value is logp_t exactly (x - x = 0) and whose gradient with respect to h_t is J_t. The
    backward pass holds no logits and runs no head: through the softmax it would recompute the
    head under mx.checkpoint (a third (positions x vocabulary x hidden) matmul and the softmax
    again) or keep (positions x vocabulary) tensors. A forward-only caller must not come here:
    it would pay for J and never use it.
    """

    def chunk(hidden, targets):
        return _frozen_head_chunk(project, hidden, targets, temperature)

    if not chunk_size or hidden.shape[1] <= chunk_size:
        return chunk(hidden, targets)
    return _by_chunks(chunk, hidden, targets, chunk_size)


def _frozen_head_chunk(project, hidden, targets, temperature):
    h = mx.stop_gradient(hidden)
    z, weights, total, lse = _softmax_terms(project(h), temperature)
    logp = mx.take_along_axis(z, targets[..., None], axis=-1).squeeze(-1) - lse
    entropy = lse - mx.sum(weights * z, axis=-1) / total.squeeze(-1)
    # d logp / d z = onehot(target) - probs, and z = head(h) / T: the slope is that over T, in one pass
    # over (positions x vocabulary) floats.
    slope = _taken_slope(weights, total, targets, mx.array(1.0 / temperature, dtype=weights.dtype))
    _, (jac,) = mx.vjp(project, [h], [slope.astype(h.dtype)])
    along = (hidden * mx.stop_gradient(jac)).sum(axis=-1)
    return mx.stop_gradient(logp) + (along - mx.stop_gradient(along)), mx.stop_gradient(entropy)


def _by_chunks(per_chunk, hidden, targets, chunk_size):
    """per_chunk(hidden, targets) -> (log-probs, entropy), `chunk_size` positions at a time, joined."""
    parts = [
        per_chunk(hidden[:, s : s + chunk_size], targets[:, s : s + chunk_size])
        for s in range(0, hidden.shape[1], chunk_size)
    ]
    return mx.concatenate([p[0] for p in parts], axis=1), mx.concatenate([p[1] for p in parts], axis=1)


def _project(
    head,
    hidden,
    targets,
    temperature,
    chunk_size,
    entropy_grad=False,
    differentiated=False,
    with_entropy=True,
):
    """Log-probs of `targets` from hidden states, `chunk_size` positions at a time.

    A chunk is also kept under _CHUNK_FLOATS logits, whatever the batch: with
    8 rows and a 152k vocabulary, 128 positions would be 0.6 GB per tensor.
    `differentiated`: the caller takes the gradient (the update); through a frozen
    head (LoRA) that gradient is then worked out in the forward pass.
    `with_entropy=False`: zeros stand for the entropies (_logprobs_and_entropy).
    """
    module, project = head
    if chunk_size:
        vocab = module.weight.shape[0] if hasattr(module, "weight") else 0
        chunk_size = max(1, min(chunk_size, _CHUNK_FLOATS // max(hidden.shape[0] * vocab, 1)))
    if differentiated and not entropy_grad and not tree_flatten(module.trainable_parameters()):
        return _through_frozen_head(project, hidden, targets, temperature, chunk_size)
    if not chunk_size or hidden.shape[1] <= chunk_size:
        return _logprobs_and_entropy(project(hidden), targets, temperature, entropy_grad, with_entropy)

    # Only trainable weights are inputs of the checkpointed chunks: a frozen head
    # (LoRA) needs no vocab x hidden gradient.
    params = module.trainable_parameters()

    def checkpointed(h, t):
        # Targets are closed over: checkpoint would otherwise try to
        # differentiate with respect to the integer indices.
        def chunk(params, h):
            module.update(params)
            return _logprobs_and_entropy(project(h), t, temperature, entropy_grad, with_entropy)

        return mx.checkpoint(chunk)(params, h)

    return _by_chunks(checkpointed, hidden, targets, chunk_size)


def token_logprobs(
    model: nn.Module, tokens: mx.array, temperature: float = 1.0, chunk_size: int | None = None
):
    """Log-prob (at `temperature`) and entropy of each next token.

    tokens: (B, L) int array. Returns two (B, L-1) arrays: position t scores
    tokens[:, t+1] given tokens[:, :t+1].
    """
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    head = output_head(model)
    if head is None:
        return _logprobs_and_entropy(model(inputs), targets, temperature)
    return _project(head, model.model(inputs), targets, temperature, chunk_size)


def continuation_logprobs(
    model: nn.Module, prompt_tokens: list[int], tokens: list[int], temperature: float
) -> list[float]:
    """The log-prob (at `temperature`) of each of `tokens` after `prompt_tokens`: the behaviour log-probs a
    sampler would have recorded for a continuation it never sampled."""
    logprobs, _ = token_logprobs(model, mx.array([list(prompt_tokens) + list(tokens)]), temperature)
    return logprobs[0, len(prompt_tokens) - 1 :].tolist()


class SharedPromptCache:
    """One layer's cache: the prompts' keys/values, reused by each prompt's G completions.

    First call (the prompt pass) stores the keys and values; the second (the
    completion pass) repeats them G times and puts the completion's own keys
    after them. Nothing is updated in place, so the whole thing is differentiable.
    """

    def __init__(self, left_padding: mx.array, group_size: int):
        self.left_padding = left_padding  # (P,) pad tokens before each prompt
        self.group_size = group_size
        self.keys = self.values = None
        self.offset = 0

    def update_and_fetch(self, keys, values):
        if self.keys is None:
            self.keys, self.values = keys, values
            self.offset = keys.shape[2]
            return keys, values
        shared_k = mx.repeat(self.keys, self.group_size, axis=0)
        shared_v = mx.repeat(self.values, self.group_size, axis=0)
        return mx.concatenate([shared_k, keys], axis=2), mx.concatenate([shared_v, values], axis=2)

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        pad = self.left_padding
        if self.offset > 0:
            pad = mx.repeat(pad, self.group_size, axis=0)
        keys = mx.arange(self.offset + n)
        queries = mx.arange(self.offset, self.offset + n)
        causal = queries[:, None] >= keys[None]
        if window_size:  # a sliding-window layer (Gemma 3) sees only the last window_size positions
            causal = causal & (keys[None] > queries[:, None] - window_size)
        not_padding = keys[None, None, None, :] >= pad[:, None, None, None]
        mask = causal[None, None] & not_padding
        if self.offset == 0:
            # A padded query position would see no key at all (a NaN softmax
            # that poisons gradients); let it see itself. Its output is unused.
            mask = mask | mx.eye(n, dtype=mx.bool_)[None, None]
        return mask

    @property
    def state(self):
        return self.keys, self.values


def prompt_pass(model: nn.Module, prompts: mx.array, left_padding: mx.array):
    """The prompts through the model once: (keys per layer, values per layer, last position's output).

    The last output is the hidden state that scores each completion's first
    token (or its logits, for a model whose head cannot be chunked).
    """
    cache = [SharedPromptCache(left_padding, 1) for _ in range(len(model.layers))]
    forward = model.model if output_head(model) is not None else model
    last = forward(prompts, cache=cache)[:, -1:]
    return [c.keys for c in cache], [c.values for c in cache], last


def scored_positions(mask: mx.array) -> mx.array:
    """Flat indices into a (B, K) completion layout where `mask` > 0: the positions worth scoring.

    Worked out outside any compiled function: how many there are sets the shapes of what follows."""
    return mx.array(np.flatnonzero(np.array(mask).reshape(-1) > 0).astype(np.int32))


def _placed(values: mx.array, positions: mx.array, shape: tuple) -> mx.array:
    """(N,) values at flat `positions` of a zero array of `shape`; the gradient reaches them alone."""
    return mx.zeros((shape[0] * shape[1],), values.dtype).at[positions].add(values).reshape(shape)


def _at_positions(score, first, completions, positions, chunk_size):
    """score(rows, targets, chunk) of the gathered `positions` only, placed back in the (B, K) layout.

    The gathered rows are one row of N positions; a chunk keeps the positions it held across the
    micro-batch's B rows (chunk_size x B), so each chunk is no larger than before."""
    rows, width = completions.shape
    picked = first.reshape(rows * width, first.shape[-1])[positions][None]
    targets = completions.reshape(-1)[positions][None]
    logp, entropy = score(picked, targets, chunk_size * rows if chunk_size else chunk_size)
    return _placed(logp[0], positions, completions.shape), _placed(entropy[0], positions, completions.shape)


def logprobs_after_prompt(
    model: nn.Module,
    state,
    left_padding: mx.array,
    completions: mx.array,
    group_size: int,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy_grad: bool = False,
    differentiated: bool = False,
    positions: mx.array | None = None,
):
    """Log-prob and entropy of every completion token, given its prompt's `prompt_pass` state.

    `differentiated`: the caller takes their gradient (`_project`). `positions` (scored_positions of
    the mask): only these go through the head; every other position reads 0."""
    if positions is not None and positions.size == 0:  # nothing scored: no pass at all, a gradient of 0
        zeros = mx.zeros(completions.shape, mx.float32)
        return zeros, zeros
    keys, values, last = state
    head = output_head(model)
    cache = []
    for k, v in zip(keys, values):
        layer = SharedPromptCache(left_padding, group_size)
        layer.keys, layer.values, layer.offset = k, v, k.shape[2]
        cache.append(layer)
    forward = model.model if head is not None else model  # hidden states, or logits
    first = mx.repeat(last, group_size, axis=0)
    if completions.shape[1] > 1:
        rest = forward(completions[:, :-1], cache=cache)
        first = mx.concatenate([first, rest], axis=1)
    if head is not None:

        def score(rows, targets, chunk):
            return _project(head, rows, targets, temperature, chunk, entropy_grad, differentiated)
    else:

        def score(rows, targets, chunk):
            return _logprobs_and_entropy(rows, targets, temperature, entropy_grad)

    if positions is None:
        return score(first, completions, chunk_size)
    return _at_positions(score, first, completions, positions, chunk_size)


def completion_logprobs(
    model: nn.Module,
    prompts: mx.array,
    left_padding: mx.array,
    completions: mx.array,
    group_size: int,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    entropy_grad: bool = False,
    differentiated: bool = False,
):
    """Log-prob and entropy of every completion token, each prompt run once.

    prompts: (P, Lp) left-padded with `left_padding[i]` pad tokens in row i.
    completions: (P * group_size, K) right-padded; rows i*G .. i*G+G-1 continue prompt i.
    Returns two (P * group_size, K) arrays: [r, j] scores completions[r, j].
    """
    state = prompt_pass(model, prompts, left_padding)
    return logprobs_after_prompt(
        model,
        state,
        left_padding,
        completions,
        group_size,
        temperature,
        chunk_size,
        entropy_grad,
        differentiated,
    )
