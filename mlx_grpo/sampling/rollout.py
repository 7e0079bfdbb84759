"""Batched sampling of completion groups.

Every prompt x group member is decoded concurrently (up to `concurrency`
sequences at once; more go in successive waves). Each prompt is prefilled once
and its keys and values handed to all G members of its group, instead of G
identical prefills. Models with plain key/value caches decode with a compiled
fixed-shape step (fixed_decode.py); others with mlx-lm's BatchGenerator. For each
completion we keep exactly what the policy gradient needs: the sampled token
ids (never decoded and re-encoded), each token's behaviour log-prob at the
sampling temperature, and why it stopped.

Sampling is seeded per completion, not per batch: completion j of a prompt
with id p draws its token at position t with a random key made from
(seed, p, j, t). A prompt's group therefore does not depend on which other
prompts share the batch, how wide the decode is, or which process samples it,
which is what lets data-parallel ranks split a step's prompts and still
reproduce a one-process run. The draw stays one batched call per decode step
(the Gumbel-max trick with one key per row).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from ..models import cpu_math
from ..models.adapters import adapters_merged
from ..models.heads import output_head
from ..setting_groups import (
    SamplingSettings as SamplingConfig,
)  # the sampler's settings: the run's sampling group
from . import fixed_decode
from .progress import PROGRESS, DecodeMeter
from .width import decode_width

# Bump on any change to what a model answers for the same model, prompts, settings and seed (the draw,
# the filters, the decode loop here or in fixed_decode.py, stopping, the decode width's effect). Answers
# that eval and compare keep (evaluation/answer_cache.py) are keyed on it, so answers an older decode
# made are decoded again, not reused as if this code had made them.
DECODE_FORMAT = 1


@dataclass
class Completion:
    prompt_index: int  # index into the prompts passed to `sample_completions`
    prompt_tokens: list[int]
    tokens: list[int]  # sampled ids, including the end token when it stopped
    logprobs: list[float]  # behaviour log mu(token) at the sampling temperature
    finish_reason: str  # "stop" (end token) or "length" (hit max_tokens)
    text: str  # decoded completion, end token left out
    guided: bool = False  # not sampled: a reference answer put into its group (run/guidance.py)

    @property
    def truncated(self) -> bool:
        """Cut at max_tokens before the model ended it: what "cut" means everywhere (an Episode has the
        same)."""
        return self.finish_reason == "length"

    @property
    def model_tokens(self) -> int:
        """Tokens the model wrote (all of them here; an episode's observations are not the model's)."""
        return len(self.tokens)


def end_token_ids(tokenizer) -> list[int]:
    ids = getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id]
    return sorted({int(i) for i in ids if i is not None})


def tempered_logprobs(logits: mx.array, tokens: mx.array, temperature: float) -> mx.array:
    """log softmax(logits / T)[token] per row (rows, vocab); greedy decoding (T = 0) reports T = 1.

    `logits` may be shifted per row by any constant (normalised log-probs are
    logits too): log softmax is shift-invariant.
    """
    logits = logits.astype(mx.float32)
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    chosen = mx.take_along_axis(logits, tokens[:, None], axis=-1).squeeze(-1)
    return chosen - cpu_math.logsumexp(logits, axis=-1)


def _prefilled_cache(model, prompt: list[int]):
    """KV cache of the prompt minus its last token (the generator feeds that one)."""
    cache = make_prompt_cache(model)
    if len(prompt) > 1:
        began = time.perf_counter()
        # Only the keys and values are wanted: where the model allows, skip the
        # vocabulary projection (with a 150k vocabulary, a quarter of the prefill's work).
        forward = model.model if output_head(model) is not None else model
        forward(mx.array([prompt[:-1]]), cache=cache)
        mx.eval([c.state for c in cache])
        fixed_decode.PREFILL.add(len(prompt) - 1, time.perf_counter() - began)
    return cache


def _shared_caches(model, prompts: list[list[int]], group_size: int):
    """One prefill per prompt; each group member gets its own copy of the result."""
    caches = []
    for prompt in prompts:
        cache = _prefilled_cache(model, prompt)
        for _ in range(group_size):
            caches.append(copy.deepcopy(cache))
    return caches


class KeyedSampler:
    """A batched sampler whose random draw for each row depends only on that row's key.

    `row_seeds[r]` is a 64-bit seed per row (completion); the row's token at
    position t uses the t-th key split from it. The decode loop says which rows
    are in the generator's batch (`rows`, in the batch's order) before each step.
    """

    def __init__(self, sampling: SamplingConfig, row_seeds: np.ndarray):
        self.sampling = sampling
        words = np.asarray(row_seeds, dtype=np.uint64)
        keys = mx.array(
            np.stack([words >> np.uint64(32), words & np.uint64(0xFFFFFFFF)], axis=1).astype(np.uint32)
        )
        # One key per row and position; max_tokens + 1 because the generator
        # samples one token past a row's last (and throws it away).
        self.keys = mx.vmap(lambda k: mx.random.split(k, sampling.max_tokens + 1))(keys)
        self.position = np.zeros(len(words), dtype=np.int64)
        self.rows: list[int] = []

    def __call__(self, logprobs: mx.array) -> mx.array:
        rows = self.rows
        if len(rows) != logprobs.shape[0]:
            raise RuntimeError("the batch generator's rows are not the ones the sampler was told about")
        keys = self.keys_at(rows, self.position[rows])
        self.position[rows] += 1
        return _sample(logprobs, keys, self.sampling)

    def keys_at(self, rows, positions) -> mx.array:
        """(len(rows), 2) keys: row rows[i] at position positions[i]."""
        return self.keys[mx.array(rows), mx.array(positions)]


def draw_tokens(logits: mx.array, keys: mx.array, sampling: SamplingConfig) -> tuple[mx.array, mx.array]:
    """One token per row from softmax(logits / T) after the filters, and its log-prob.

    Row i's draw uses keys[i] alone. The log-prob is log softmax(logits / T) of
    the token under the unfiltered distribution, which is what the trainer's
    forward pass computes.
    """
    logits = logits.astype(mx.float32)
    if _filters(sampling):  # the filters read log-probs at temperature 1
        normalised = logits - cpu_math.logsumexp(logits, axis=-1, keepdims=True)
        tokens = _sample(normalised, keys, sampling)
        if (
            sampling.temperature == 1.0
        ):  # those are the log-probs wanted: read the taken ones, no second normaliser
            return tokens, mx.take_along_axis(normalised, tokens[:, None], axis=-1).squeeze(-1)
        return tokens, tempered_logprobs(logits, tokens, sampling.temperature)
    # No filter: the draw's own log-normaliser is the log-prob's (one pass of exp over the vocabulary, not
    # two).
    scaled = logits if sampling.temperature == 1.0 else logits / sampling.temperature
    tokens, normaliser = gumbel_max(scaled, keys)
    return tokens, mx.take_along_axis(scaled, tokens[:, None], axis=-1).squeeze(-1) - normaliser


def _filters(sampling: SamplingConfig) -> list:
    """The filters that are on, as mlx-lm's make_sampler applies them (top-p, min-p, top-k, in its order)."""
    filters = []
    if 0 < sampling.top_p < 1:
        filters.append(lambda logprobs: apply_top_p(logprobs, sampling.top_p))
    if sampling.min_p != 0:
        filters.append(lambda logprobs: apply_min_p(logprobs, sampling.min_p))
    if sampling.top_k > 0:
        filters.append(lambda logprobs: apply_top_k(logprobs, sampling.top_k))
    return filters


def _sample(logprobs: mx.array, keys: mx.array, sampling: SamplingConfig) -> mx.array:
    """Tokens from log-probs (rows, vocab), row i drawn with keys[i] alone.

    The filters read log-probs at temperature 1, so with a filter on they must
    be normalised; without one, logits shifted by any constant per row do.
    """
    for apply_filter in _filters(sampling):
        logprobs = apply_filter(logprobs)
    return gumbel_max(logprobs * (1 / sampling.temperature), keys)[0]


# Tokens per block of the two-level draw below (151,936 = 1,187 blocks of 128).
BLOCK = 128


def gumbel_max(scaled: mx.array, keys: mx.array) -> tuple[mx.array, mx.array]:
    """A token per row from softmax(scaled), and each row's log-normaliser log(sum(exp(scaled))).

    argmax(scaled + Gumbel noise) is a sample from softmax(scaled), and a
    rounding-level change in the logits moves it only at a near-tie (inverse-CDF
    sampling, one uniform a row, moved 0.5-3% of tokens under 1e-5 noise on 152k
    logits: two batches that share a prompt must draw the same completions).
    Noise for every vocabulary entry costs more than the model's decode step on
    a CPU, so the draw is made in two levels, each a Gumbel-max, which is exact:
    a block of BLOCK consecutive tokens is drawn with probability its share of
    the mass (its log-sum-exp plus one Gumbel), then a token within it (its
    logits plus BLOCK Gumbels). The first level's exps give the normaliser too.
    Row i's block noise and within-block noise come from keys[i] alone: key
    number b of its split for block b, the last for the blocks' own draw.
    """
    rows, vocab = scaled.shape
    blocks = -(-vocab // BLOCK)
    if blocks * BLOCK != vocab:  # padding never wins: -inf in both levels
        scaled = mx.pad(scaled, [(0, 0), (0, blocks * BLOCK - vocab)], constant_values=-float("inf"))
    scaled = scaled.reshape(rows, blocks, BLOCK)
    top = mx.max(scaled, axis=(1, 2), keepdims=True)
    weights = mx.where(
        scaled > -float("inf"), cpu_math.exp(scaled - top), 0.0
    )  # filtered and padded: exactly 0
    mass = weights.sum(axis=-1)  # (rows, blocks)
    normaliser = mx.log(mass.sum(axis=-1)) + top.reshape(rows)
    split = mx.vmap(lambda k: mx.random.split(k, blocks + 1))(keys)  # (rows, blocks + 1, 2)
    block_noise = mx.vmap(lambda k: mx.random.gumbel((blocks,), key=k))(split[:, blocks])
    block = mx.argmax(mx.log(mass) + block_noise, axis=-1)
    chosen = mx.take_along_axis(scaled, block[:, None, None], axis=1).squeeze(1)  # (rows, BLOCK)
    block_key = mx.take_along_axis(split, block[:, None, None], axis=1).squeeze(1)
    token_noise = mx.vmap(lambda k: mx.random.gumbel((BLOCK,), key=k))(block_key)
    within = mx.argmax(chosen + token_noise, axis=-1)
    return (block * BLOCK + within).astype(mx.uint32), normaliser


def greedy_tokens(logits: mx.array) -> tuple[mx.array, mx.array]:
    """The most likely token of each row, and its log-prob at temperature 1."""
    logits = logits.astype(mx.float32)
    tokens = mx.argmax(logits, axis=-1)
    return tokens, tempered_logprobs(logits, tokens, 1.0)


def _greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def completion_seeds(seed: int, prompt_ids: list[int], group_size: int) -> np.ndarray:
    """One 64-bit seed per completion, from (seed, prompt id, member) alone."""
    return np.array(
        [
            np.random.SeedSequence([seed, pid, j]).generate_state(1, dtype=np.uint64)[0]
            for pid in prompt_ids
            for j in range(group_size)
        ],
        dtype=np.uint64,
    )


def sample_completions(
    model,
    tokenizer,
    prompts: list[list[int]],
    group_size: int,
    sampling: SamplingConfig,
    concurrency: int = 256,
    seed: int | None = None,
    prompt_ids: list[int] | None = None,
) -> list[Completion]:
    """Sample `group_size` completions per prompt; returned grouped by prompt.

    The result is ordered [p0 c0..c(G-1), p1 c0..c(G-1), ...]. Completion j of
    prompt i is drawn from keys of (seed, prompt_ids[i], j) alone; prompt_ids
    defaults to 0, 1, ... and seed, when None, is drawn from MLX's global
    random state (seed that with mx.random.seed for a repeatable run).
    At most `concurrency` sequences decode at once, fewer where the memory
    budget would not hold their keys and values (width.decode_width): more go
    in successive waves.
    temperature 0 decodes greedily.
    """
    if prompt_ids is None:
        prompt_ids = list(range(len(prompts)))
    if len(prompt_ids) != len(prompts):
        raise ValueError("prompt_ids needs one id per prompt")
    if seed is None:
        seed = int(mx.random.randint(0, 2**31 - 1, ()).item())
    sampler = (
        KeyedSampler(sampling, completion_seeds(seed, prompt_ids, group_size))
        if sampling.temperature > 0
        else None
    )
    end_ids = end_token_ids(tokenizer)
    n = len(prompts) * group_size
    tokens = [[] for _ in range(n)]
    logprobs = [[] for _ in range(n)]
    finish = [None] * n
    # The memory budget may lower the width (width.py; the same rule as multi-turn rollouts').
    longest = max(len(p) for p in prompts) + sampling.max_tokens
    width = decode_width(model, longest, max(1, concurrency))
    listener = PROGRESS.get()
    meter = DecodeMeter(n, sampling.max_tokens, listener) if listener is not None else None
    fixed = fixed_decode.supports_fixed_decode(model, longest)
    caches = (
        None if fixed else _shared_caches(model, prompts, group_size)
    )  # mlx-lm's generator: caches that grow
    for start in range(0, n, width):
        wave = list(range(start, min(n, start + width)))
        on_step = (
            (lambda position, finished, made, size=len(wave): meter.step(size, position, finished, made))
            if meter
            else None
        )
        if fixed:
            out = _decode_fixed(
                model, [prompts[i // group_size] for i in wave], wave, sampler, end_ids, sampling, on_step
            )
            for i, t, lp, f in zip(wave, *out):
                tokens[i], logprobs[i], finish[i] = t, lp, f
        else:  # sliding-window or recurrent caches
            _decode_wave(
                model,
                [prompts[i // group_size] for i in wave],
                wave,
                caches[start : start + width],
                sampler,
                end_ids,
                sampling,
                tokens,
                logprobs,
                finish,
                on_step,
            )
        if meter:
            meter.step(
                len(wave),
                max(len(tokens[i]) for i in wave),
                len(wave),
                sum(len(tokens[i]) for i in wave),
                ended=True,
            )

    completions = []
    for i in range(n):
        body = tokens[i][:-1] if finish[i] == "stop" else tokens[i]
        completions.append(
            Completion(
                prompt_index=i // group_size,
                prompt_tokens=list(prompts[i // group_size]),
                tokens=tokens[i],
                logprobs=logprobs[i],
                finish_reason=finish[i],
                text=tokenizer.decode(body),
            )
        )
    return completions


def fixed_sampler(sampler, rows, sampling: SamplingConfig):
    """(pick, keys_at, sampling_key) for fixed_decode: batch row b is the sampler's row rows[b]."""
    if sampler is None:

        def pick(logits, keys):
            return greedy_tokens(logits)

        def keys_at(batch, t):
            return mx.zeros((len(batch), 2), dtype=mx.uint32)
    else:

        def pick(logits, keys):
            return draw_tokens(logits, keys, sampling)

        def keys_at(batch, t):
            return sampler.keys_at([rows[b] for b in batch], [t] * len(batch))

    return pick, keys_at, (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p)


def _decode_fixed(model, prompts, rows, sampler, end_ids, sampling, on_step=None):
    """Decode `rows` (one per prompt given) with the compiled fixed-shape loop; see fixed_decode.py."""
    pick, keys_at, sampling_key = fixed_sampler(sampler, rows, sampling)
    with adapters_merged(model):
        return fixed_decode.decode(
            model, prompts, sampling.max_tokens, sampling_key, pick, keys_at, end_ids, on_step
        )


def generator_step(
    generator,
    sampler,
    active: list[int],
    row_of: dict,
    temperature: float,
    tokens: list,
    logprobs: list,
    finish: list,
) -> list:
    """One step of a BatchGenerator whose batch is the rows `active`, in order: each row's token and its
    log-prob at `temperature` appended, a finished row's reason set. Returns the step's responses."""
    if sampler is not None:
        sampler.rows = active  # the sampler keys each batch row by the row it is
    responses = generator.next_generated()
    if not responses:
        raise RuntimeError("the batch generator stopped before every completion finished")
    if [row_of[r.uid] for r in responses] != active:
        raise RuntimeError("the batch generator reordered its rows; per-completion seeding needs mlx-lm 0.32")
    step_logprobs = tempered_logprobs(
        mx.stack([r.logprobs for r in responses]), mx.array([r.token for r in responses]), temperature
    ).tolist()
    for r, lp in zip(responses, step_logprobs):
        i = row_of[r.uid]
        tokens[i].append(r.token)
        logprobs[i].append(lp)
        if r.finish_reason is not None:
            finish[i] = r.finish_reason
    return responses


def _decode_wave(
    model, prompts, rows, caches, sampler, end_ids, sampling, tokens, logprobs, finish, on_step=None
):
    """Decode `rows` together (all admitted at once) until each has finished.

    Every row enters the generator's batch in the first step and leaves it when
    it finishes, so the batch is always the unfinished rows in insertion order;
    the sampler is told that list, and each step's responses confirm it.
    """
    generator = BatchGenerator(
        model,
        max_tokens=sampling.max_tokens,
        stop_tokens=[[i] for i in end_ids],
        sampler=sampler or _greedy,
        completion_batch_size=len(rows),
        prefill_batch_size=len(rows),
    )
    try:
        uids = generator.insert(
            [p[-1:] for p in prompts], caches=caches, all_tokens=[list(p[:-1]) for p in prompts]
        )
        row_of = dict(zip(uids, rows))
        active = list(rows)
        while active:
            generator_step(generator, sampler, active, row_of, sampling.temperature, tokens, logprobs, finish)
            active = [i for i in active if finish[i] is None]
            if on_step is not None:
                on_step(
                    max(len(tokens[i]) for i in rows),
                    len(rows) - len(active),
                    sum(len(tokens[i]) for i in rows),
                )
    finally:
        generator.close()
