"""A compiled decode loop with fixed shapes, for models with plain key/value caches.

Why it exists: at the sizes this tool trains on a laptop, a decode step costs
more in per-operation overhead than in arithmetic (a 2-layer model spends ~3 ms
a step in mlx-lm's generator, almost none of it in matmuls). `mx.compile` fuses
a step's elementwise work into a few kernels, but it retraces whenever an input
shape changes, and mlx-lm's caches grow by one position every step.

So each row gets a key/value buffer of fixed length, written in place at the
step's position; slots not yet written, and each row's left padding, are
masked. Every step of a rollout then has the same shapes and runs one compiled
graph. RoPE takes each row's own position (buffer slot minus its padding), so a
row computes what it would alone, whatever the other rows' prompt lengths.
Buffer lengths are rounded up to a multiple of 64, so that later rollouts with
prompts of similar length reuse the compiled step. Attention reads only the
buffer's first slots up to the step's position, rounded up to a multiple of 64
(one compiled step per such length): on the CPU attending over a whole 576-slot
buffer from the first step cost a third of a 0.5B decode step at 64 rows, and
more than the matmuls at 256 (docs/performance.md).

Rows that finish keep their slot (their tokens are ignored) until at most half
the batch is still decoding; the live rows then move to a batch half as wide,
rounded to a power of two so that few widths are ever compiled.

The sampler is the one `rollout.py` describes: row r's token at position t is
argmax(filtered log-probs / T + Gumbel noise from key (r, t)).
"""

from __future__ import annotations

import copy
import gc
import time
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from ..models.heads import output_head

_LENGTH_MULTIPLE = 64
# Attention reads the buffer up to the step's slot rounded up to this: fewer wasted slots, more compiled
# steps.
_ATTENTION_MULTIPLE = 64


class PrefillMeter:
    """Tokens prefilled and seconds spent prefilling, summed over the process (benchmarks read it)."""

    def __init__(self):
        self.tokens, self.seconds = 0, 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds


PREFILL = PrefillMeter()


class _FixedCache:
    """One layer's buffers for one step: the step's keys go in at `slot`; attention sees `visible`."""

    def __init__(self, keys, values, slot, positions, visible):
        self.keys, self.values = keys, values
        self.slot = slot
        self.offset = positions  # RoPE reads this: each row's position in its own sequence
        self.visible = visible

    def update_and_fetch(self, keys, values):
        start = mx.reshape(self.slot, (1,))
        self.keys = mx.slice_update(self.keys, keys, start, axes=(2,))
        self.values = mx.slice_update(self.values, values, start, axes=(2,))
        seen = self.visible.shape[-1]  # the slots attention reads: those written so far, rounded up
        return self.keys[:, :, :seen], self.values[:, :, :seen]

    def make_mask(self, n, return_array=False, window_size=None):
        return self.visible


def supports_fixed_decode(model, length: int | None = None) -> bool:
    """True when every layer uses mlx-lm's plain KVCache (no state-space layers), or a sliding window
    (Gemma 3) at least `length` long, the longest sequence to decode: then no key ever leaves the
    window, and the window changes nothing."""
    for cache in make_prompt_cache(model):
        window = type(cache) is RotatingKVCache and length is not None and cache.keep == 0
        if type(cache) is not KVCache and not (window and length <= cache.max_size):
            return False
    return True


def _make_step(model, pick, seen: int):
    def step(tokens, keys, values, slot, left_padding, random_keys):
        slots = mx.arange(seen)
        visible = ((slots[None] <= slot) & (slots[None] >= left_padding[:, None]))[:, None, None, :]
        positions = slot - left_padding
        caches = [_FixedCache(k, v, slot, positions, visible) for k, v in zip(keys, values)]
        logits = model(tokens[:, None], cache=caches)[:, -1]
        chosen, chosen_logprobs = pick(logits, random_keys)
        return chosen, chosen_logprobs, [c.keys for c in caches], [c.values for c in caches]

    # The weights are implicit inputs, read at every call: an optimizer update
    # between rollouts is seen without recompiling.
    return mx.compile(step, inputs=model.state)


# The compiled steps of the model that sampled last, one per sampling setting.
# Compiled graphs are cached per function, so a step must outlive a rollout;
# it holds its model, so only the last model is kept (comparing two models
# must not keep the first one's weights alive while the second decodes).
_last = {"model": None, "steps": {}}
# Models whose compiled steps stay for the life of the process, beside the last
# model's: a judge decodes between two rollouts of the policy every training
# step, and would otherwise make both recompile every time (4-6x the judge's
# decode time with the embedded model). Its weights stay loaded anyway.
_kept: dict[int, tuple] = {}


def keep_compiled(model) -> None:
    """Keep `model`'s compiled decode steps until the process ends (see _kept)."""
    _kept.setdefault(id(model), (model, {}))


def _compiled_step(model, sampling_key, pick, seen: int):
    """The compiled step for this sampling setting whose attention reads the first `seen` slots."""
    if id(model) in _kept:
        steps = _kept[id(model)][1]
    else:
        if _last["model"] is not model:
            _last["model"], _last["steps"] = model, {}
        steps = _last["steps"]
    if (sampling_key, seen) not in steps:
        steps[sampling_key, seen] = _make_step(model, pick, seen)
    return steps[sampling_key, seen]


def slots_seen(slot: int, length: int) -> int:
    """How many buffer slots a step writing `slot` attends over: up to it, rounded up, within the buffer."""
    return min(length, _round_up(slot + 1, _ATTENTION_MULTIPLE))


def release() -> None:
    """Drop the compiled steps, and with them the last sampling model's weights, and hand MLX's cached
    buffers back: whoever loads the next model (GRPO after its warm start, compare's second model) gets
    the memory, instead of holding two models at once until the next decode replaces these steps."""
    _last["model"], _last["steps"] = None, {}
    gc.collect()  # none today, but a reference cycle through the model would keep it until a collection
    mx.clear_cache()


# A prefix shared by every prompt (a base model's few-shot frame) is prefilled once when at least this long.
_MIN_SHARED = 16


def _shared_start(prefixes) -> tuple:
    """The longest run of tokens that every prefix starts with."""
    first, n = min(prefixes, key=len), 0
    while n < len(first) and all(p[n] == first[n] for p in prefixes):
        n += 1
    return tuple(first[:n])


def _copy_of(cache):
    """An independent copy of a prefilled prompt cache: the keys and values cut to what is written,
    so that the copy's next write makes new arrays instead of writing into the shared ones."""
    copies = []
    for c in cache:
        c2 = copy.copy(c)
        c2.keys, c2.values = c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
        if isinstance(c, RotatingKVCache):
            c2._idx = c.offset  # in order and not yet rotated: shorter than its window
        copies.append(c2)
    return copies


def _prefilled_buffers(model, prompts, prefix_length, max_tokens):
    """Per layer, (rows, kv_heads, prefix_length + max_tokens, head_dim) key and value buffers.

    Each distinct prompt prefix (the prompt minus its last token, which the first
    step feeds) runs once; its keys and values are right-aligned in the prefix
    of every row that continues it. Tokens that every prefix starts with (a
    base model's worked examples) run once for all of them. The buffers are
    built one layer at a time, each prefix's layer let go once placed: the
    peak stays near the buffers' own size, not a multiple of it.
    """
    began = time.perf_counter()
    forward = model.model if output_head(model) is not None else model  # keys and values only
    prefixes = {}
    for p in prompts:
        prefixes.setdefault(tuple(p[:-1]), len(prefixes))
    shared = _shared_start(list(prefixes)) if len(prefixes) > 1 else ()
    base = None
    if len(shared) >= _MIN_SHARED and all(
        type(c) in (KVCache, RotatingKVCache) for c in make_prompt_cache(model)
    ):
        base = make_prompt_cache(model)
        forward(mx.array([shared]), cache=base)
        mx.eval([c.state for c in base])
    prefilled, tokens = [], len(shared) if base is not None else 0
    for prefix in prefixes:
        if base is not None:
            cache, rest = _copy_of(base), prefix[len(shared) :]
        else:
            cache, rest = make_prompt_cache(model), prefix or (0,)  # an empty prefix runs a dummy token
        if rest:
            forward(mx.array([rest]), cache=cache)
        tokens += len(rest)
        prefilled.append((cache, len(prefix)))
    rows = mx.array([prefixes[tuple(p[:-1])] for p in prompts])
    keys, values = [], []
    for layer in range(len(prefilled[0][0])):
        for part, out in ((0, keys), (1, values)):
            per_prefix = [
                mx.pad(
                    cache[layer].state[part][:, :, :used], [(0, 0), (0, 0), (prefix_length - used, 0), (0, 0)]
                )
                for cache, used in prefilled
            ]
            out.append(mx.pad(mx.concatenate(per_prefix)[rows], [(0, 0), (0, 0), (0, max_tokens), (0, 0)]))
        mx.eval(keys[-1], values[-1])
        for cache, _ in prefilled:
            cache[layer].keys = cache[layer].values = None
    PREFILL.add(tokens, time.perf_counter() - began)
    return keys, values


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def buffer_length(tokens: int) -> int:
    """Buffer slots for `tokens` positions, rounded up so that similar rollouts reuse a compiled step."""
    return _round_up(tokens, _LENGTH_MULTIPLE)


@dataclass
class Rows:
    """Per-layer key and value buffers (rows, kv_heads, length, head_dim) and each row's left padding.

    Whoever holds a Rows holds its buffers: `take` hands them over and lets
    go, so that a decode step can write them in place (an array still
    referenced elsewhere is copied instead).
    """

    keys: list | None
    values: list | None
    left_padding: list[int]

    def take(self) -> tuple[list, list]:
        keys, values = self.keys, self.values
        self.keys = self.values = None
        return keys, values


@dataclass
class Decoded:
    tokens: list[list[int]]
    logprobs: list[list[float]]
    finish: list[str | None]
    # With keep=True: every row's buffers after the decode, as (row indices, Rows) pieces
    # (the batch at the end, and the rows set aside when it narrowed).
    pieces: list[tuple[list[int], Rows]] = field(default_factory=list)


def decode(model, prompts, max_tokens, sampling_key, pick, random_keys, end_ids, on_step=None):
    """Decode one completion per prompt, all rows at once. Returns (tokens, logprobs, finish) per row.

    pick(logits, keys) -> (tokens, their log-probs) is the sampler, the same for
    every call with the same sampling_key; random_keys(rows, t) gives the
    (len(rows), 2) keys for position t of those rows. on_step(position, rows
    finished, tokens sampled), when given, hears after every step.
    """
    longest = max(len(p) - 1 for p in prompts)
    prefix = buffer_length(longest + max_tokens) - max_tokens
    keys, values = _prefilled_buffers(model, prompts, prefix, max_tokens)
    rows = Rows(keys, values, [prefix - (len(p) - 1) for p in prompts])
    del keys, values
    out = decode_rows(
        model,
        rows,
        prefix,
        [p[-1] for p in prompts],
        max_tokens,
        sampling_key,
        pick,
        random_keys,
        end_ids,
        on_step=on_step,
    )
    return out.tokens, out.logprobs, out.finish


def decode_rows(
    model,
    rows: Rows,
    start: int,
    first_tokens,
    max_tokens,
    sampling_key,
    pick,
    random_keys,
    end_ids,
    keep: bool = False,
    on_step=None,
) -> Decoded:
    """Decode from buffers already filled up to slot `start` (exclusive); first_tokens go in at `start`.

    Row r's context is slots [rows.left_padding[r], start). With keep, the
    buffers come back in `Decoded.pieces` (row r then holds its context and the
    tokens it fed: slots up to start + len(tokens[r])); without, they are let go.
    """
    keys, values = rows.take()
    n = len(first_tokens)
    left_padding = mx.array(rows.left_padding, dtype=mx.int32)
    row_padding = list(rows.left_padding)
    length = keys[0].shape[2]

    def step(tokens, keys, values, slot: int, left_padding, random_keys):
        compiled = _compiled_step(model, sampling_key, pick, slots_seen(slot, length))
        return compiled(tokens, keys, values, mx.array(slot, dtype=mx.int32), left_padding, random_keys)

    end = set(end_ids)

    tokens = [[] for _ in range(n)]
    logprobs = [[] for _ in range(n)]
    finish = [None] * n
    parked = []
    batch = list(range(n))  # rows in the compiled batch, in order
    pending = step(
        mx.array(first_tokens, dtype=mx.int32), keys, values, start, left_padding, random_keys(batch, 0)
    )
    del keys, values
    for t in range(max_tokens):
        chosen, chosen_logprobs, keys, values = pending
        if t + 1 < max_tokens:
            # Queue the next step before reading this one: building and running overlap.
            pending = step(chosen, keys, values, start + t + 1, left_padding, random_keys(batch, t + 1))
            # Drop our references: the step then writes the new slot into these buffers in place
            # instead of copying every layer's buffers (13% of a 256-token SmolLM2 rollout).
            del keys, values
            mx.async_eval(pending)
        for r, token, lp in zip(batch, chosen.tolist(), chosen_logprobs.tolist()):
            if finish[r] is not None:
                continue
            tokens[r].append(token)
            logprobs[r].append(lp)
            if token in end:
                finish[r] = "stop"
            elif len(tokens[r]) == max_tokens:
                finish[r] = "length"
        live = [j for j, r in enumerate(batch) if finish[r] is None]
        if on_step is not None:
            on_step(t + 1, n - len(live), sum(map(len, tokens)))
        if not live:
            break
        width = _power_of_two_at_least(len(live))
        if t + 1 < max_tokens and width <= len(batch) // 2:
            # Keep the live rows (and a few finished ones, to a power-of-two width).
            kept = live + [j for j in range(len(batch)) if finish[batch[j]] is not None][: width - len(live)]
            kept.sort()
            index = mx.array(kept)
            chosen, chosen_logprobs, keys, values = pending
            pending = None
            if keep:  # the rows let out of the batch keep their buffers, one layer at a time
                out = sorted(set(range(len(batch))) - set(kept))
                (keys, values), (out_keys, out_values) = _split_rows(keys, values, [kept, out])
                parked.append(
                    (
                        [batch[j] for j in out],
                        Rows(out_keys, out_values, [row_padding[batch[j]] for j in out]),
                    )
                )
            else:
                keys, values = [k[index] for k in keys], [v[index] for v in values]
            pending = (chosen[index], chosen_logprobs[index], keys, values)
            del keys, values
            left_padding = left_padding[index]
            batch = [batch[j] for j in kept]
    decoded = Decoded(tokens, logprobs, finish)
    if keep:
        keys, values = pending[2], pending[3]
        pending = None
        decoded.pieces = [(batch, Rows(keys, values, [row_padding[r] for r in batch])), *parked]
    return decoded


def _split_rows(keys: list, values: list, groups: list[list[int]]):
    """The rows of each group, per layer: ([keys...], [values...]) for each group.

    One layer at a time, evaluated and the input layer let go, so that the
    peak is the buffers plus one layer, not twice the buffers.
    """
    out = [([], []) for _ in groups]
    indices = [mx.array(g) for g in groups]
    for layer in range(len(keys)):
        for part, arrays in ((0, keys), (1, values)):
            taken = [arrays[layer][i] for i in indices]
            mx.eval(taken)
            arrays[layer] = None
            for o, a in zip(out, taken):
                o[part].append(a)
    return out
