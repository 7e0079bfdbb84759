"""One model turn for every episode still playing: three ways to play it.

- `FixedTurns` (models with plain key/value caches): the fixed-shape decoder,
  its buffers kept from turn to turn (turn_cache.py). A turn prefills only
  what is new, batched across the episodes still playing; finished episodes
  give their rows back.
- `GeneratorTurns` (sliding-window models): mlx-lm's BatchGenerator, each
  episode's cache taken back when its turn ends and handed in again with the
  new tokens, which the generator prefills as one batch.
- `Reprefill`: every turn prefills each conversation again from its first
  token. The fallback for caches that cannot be extended (quantized key/value
  caches, state-space layers), and the reference the others are tested against.

`player_for` picks one. Every player draws episode e's tokens of turn t with
the keys of `turn_row_seed`, so the three sample the same tokens where their
logits agree. e counts from the player's `first`: an episode's number in the
whole step, so a process playing a share of it draws what one process would.
"""

from __future__ import annotations

import copy
import time

import numpy as np
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from ..models.adapters import adapters_merged
from . import fixed_decode, turn_cache
from .rollout import (
    Completion,
    KeyedSampler,
    SamplingConfig,
    _greedy,
    _prefilled_cache,
    end_token_ids,
    fixed_sampler,
    generator_step,
    sample_completions,
)


def turn_seed(seed: int, turn: int) -> int:
    return int(np.random.SeedSequence([seed, turn]).generate_state(1)[0])


def turn_row_seeds(seed: int, turn: int, episodes: list[int], group_size: int) -> np.ndarray:
    """Episode e's seed for turn t: on turn 0 (seed_0, e's group, e's place in it), then (seed_t, e, 0).

    The same seeds as sample_completions gives its rows with seed_t and
    prompt ids (groups on turn 0, episodes after), so that Reprefill draws
    alike.
    """
    s = turn_seed(seed, turn)
    ids = [(e // group_size, e % group_size) if turn == 0 else (e, 0) for e in episodes]
    return np.array(
        [np.random.SeedSequence([s, a, b]).generate_state(1, dtype=np.uint64)[0] for a, b in ids],
        dtype=np.uint64,
    )


def completion(
    tokenizer, index: int, prompt: list[int], tokens: list[int], logprobs: list[float], finish: str
) -> Completion:
    body = tokens[:-1] if finish == "stop" else tokens
    return Completion(index, list(prompt), tokens, logprobs, finish, tokenizer.decode(body))


class Stats:
    """What the turns cost: tokens prefilled, prefill and decode seconds (one dict a turn)."""

    def __init__(self):
        self.turns: list[dict] = []

    def add(self, **values) -> None:
        self.turns.append(values)


class Reprefill:
    """Today's way: each turn samples from the whole conversation so far (sample_completions)."""

    reuses_cache = False
    first = 0  # the step's number of episode 0 here (player_for sets it)

    def __init__(self, model, tokenizer, group_size: int, seed: int, concurrency: int):
        self.model, self.tokenizer, self.group_size, self.seed = model, tokenizer, group_size, seed
        self.concurrency = concurrency

    def play(
        self, turn, episodes, chunks, contexts, sampling: SamplingConfig
    ) -> tuple[list[Completion], dict]:
        meter = fixed_decode.PREFILL
        tokens, seconds, began = meter.tokens, meter.seconds, time.perf_counter()
        if turn == 0:  # the episodes of a group share their first prompt: prefilled once
            heads = episodes[:: self.group_size]
            outs = sample_completions(
                self.model,
                self.tokenizer,
                [contexts[episodes.index(e)] for e in heads],
                self.group_size,
                sampling,
                self.concurrency,
                seed=turn_seed(self.seed, 0),
                prompt_ids=[(self.first + e) // self.group_size for e in heads],
            )
        else:
            outs = sample_completions(
                self.model,
                self.tokenizer,
                contexts,
                1,
                sampling,
                self.concurrency,
                seed=turn_seed(self.seed, turn),
                prompt_ids=[self.first + e for e in episodes],
            )
        prefill = meter.seconds - seconds
        return outs, {
            "prefilled": meter.tokens - tokens,
            "prefill_s": prefill,
            "decode_s": time.perf_counter() - began - prefill,
        }


def _sampler(sampling, seed, turn, episodes, group_size):
    if sampling.temperature <= 0:
        return None
    return KeyedSampler(sampling, turn_row_seeds(seed, turn, episodes, group_size))


class FixedTurns:
    """The fixed-shape decoder with each episode's buffers kept between turns."""

    reuses_cache = True
    first = 0

    def __init__(self, model, tokenizer, group_size: int, seed: int):
        self.model, self.tokenizer, self.group_size, self.seed = model, tokenizer, group_size, seed
        self.end_ids = end_token_ids(tokenizer)
        self.pieces, self.batch, self.ends = None, [], []  # the last turn's buffers, episodes and end slots

    def play(
        self, turn, episodes, chunks, contexts, sampling: SamplingConfig
    ) -> tuple[list[Completion], dict]:
        # Batch row b plays episodes[order[b]]; after the first turn, longest chunk first
        # (turn_cache.prefill).
        order = list(range(len(episodes)))
        if self.pieces is not None:
            order.sort(key=lambda i: -len(chunks[i]))
        chunks = [chunks[i] for i in order]
        pick, keys_at, sampling_key = fixed_sampler(
            _sampler(sampling, self.seed, turn, [self.first + e for e in episodes], self.group_size),
            order,
            sampling,
        )
        began = time.perf_counter()
        meter = fixed_decode.PREFILL
        with adapters_merged(self.model):
            if self.pieces is None:  # the first prompts: each distinct one prefilled once for its group
                tokens = meter.tokens
                longest = max(len(c) - 1 for c in chunks)
                start = fixed_decode.buffer_length(longest + sampling.max_tokens) - sampling.max_tokens
                keys, values = fixed_decode._prefilled_buffers(self.model, chunks, start, sampling.max_tokens)
                buffers = fixed_decode.Rows(keys, values, [start - (len(c) - 1) for c in chunks])
                del keys, values
                prefilled = meter.tokens - tokens
            else:
                position = {e: b for b, e in enumerate(self.batch)}
                pieces, self.pieces = self.pieces, None
                buffers, start = turn_cache.appended(
                    pieces, self.ends, [position[episodes[i]] for i in order], chunks, sampling.max_tokens
                )
                del pieces
                prefilled = turn_cache.prefill(self.model, buffers, start, chunks)
            prefill = time.perf_counter() - began
            decoded = fixed_decode.decode_rows(
                self.model,
                buffers,
                start,
                [c[-1] for c in chunks],
                sampling.max_tokens,
                sampling_key,
                pick,
                keys_at,
                self.end_ids,
                keep=True,
            )
        self.pieces, self.batch = decoded.pieces, [episodes[i] for i in order]
        self.ends = [start + len(t) for t in decoded.tokens]
        outs = [None] * len(episodes)
        for b, i in enumerate(order):
            outs[i] = completion(
                self.tokenizer, i, contexts[i], decoded.tokens[b], decoded.logprobs[b], decoded.finish[b]
            )
        return outs, {
            "prefilled": prefilled,
            "prefill_s": prefill,
            "decode_s": time.perf_counter() - began - prefill,
        }

    def close(self) -> None:
        self.pieces = None


class GeneratorTurns:
    """mlx-lm's BatchGenerator, each episode's cache taken back after its turn and extended the next."""

    reuses_cache = True
    first = 0

    def __init__(self, model, tokenizer, group_size: int, seed: int):
        self.model, self.tokenizer, self.group_size, self.seed = model, tokenizer, group_size, seed
        self.end_ids = end_token_ids(tokenizer)
        self.caches: dict[int, list] = {}

    def play(
        self, turn, episodes, chunks, contexts, sampling: SamplingConfig
    ) -> tuple[list[Completion], dict]:
        began = time.perf_counter()
        caches, prompts, prefilled = [], [], 0
        if not self.caches:  # the first prompts: each distinct one prefilled once, copied to its rows
            shared = {}
            for chunk in chunks:
                if tuple(chunk) not in shared:
                    shared[tuple(chunk)] = _prefilled_cache(self.model, chunk)
                    prefilled += len(chunk) - 1
                caches.append(copy.deepcopy(shared[tuple(chunk)]))
                prompts.append(chunk[-1:])
            del shared
        else:
            for e, chunk in zip(episodes, chunks):
                # The generator feeds each token it returns before returning it: the cache
                # holds the turn's last token already, so the chunk's first one is left out.
                caches.append(self.caches.pop(e))
                prompts.append(chunk[1:])
                prefilled += len(chunk) - 2
            self.caches = {}  # finished episodes let go of theirs
        sampler = _sampler(sampling, self.seed, turn, [self.first + e for e in episodes], self.group_size)
        generator = BatchGenerator(
            self.model,
            max_tokens=sampling.max_tokens,
            stop_tokens=[[i] for i in self.end_ids],
            sampler=sampler or _greedy,
            completion_batch_size=len(episodes),
            prefill_batch_size=len(episodes),
            prefill_step_size=max(len(p) for p in prompts) + 1,
        )  # one prefill call for all
        n = len(episodes)
        tokens, logprobs, finish = [[] for _ in range(n)], [[] for _ in range(n)], [None] * n
        decode_began = None
        try:
            uids = generator.insert(prompts, caches=caches, all_tokens=[[] for _ in prompts])
            del caches
            row_of = {u: i for i, u in enumerate(uids)}
            active = list(range(n))
            while active:
                responses = generator_step(
                    generator, sampler, active, row_of, sampling.temperature, tokens, logprobs, finish
                )
                decode_began = decode_began or time.perf_counter()
                for r in responses:
                    if r.finish_reason is not None:  # its keys and values, last token not yet fed
                        self.caches[episodes[row_of[r.uid]]] = r.prompt_cache
                active = [i for i in active if finish[i] is None]
        finally:
            generator.close()
        # The generator prefills inside its first step: the time to the first token counts as prefill.
        prefill = (decode_began or time.perf_counter()) - began
        outs = [
            completion(self.tokenizer, i, contexts[i], tokens[i], logprobs[i], finish[i]) for i in range(n)
        ]
        return outs, {
            "prefilled": prefilled,
            "prefill_s": prefill,
            "decode_s": time.perf_counter() - began - prefill,
        }

    def close(self) -> None:
        self.caches = {}


_EXTENDABLE = (KVCache, RotatingKVCache)  # what mlx-lm merges and extracts exactly, with new tokens appended


def player_for(
    model, tokenizer, group_size: int, seed: int, concurrency: int, reuse_cache: bool = True, first: int = 0
):
    """FixedTurns where the fixed decoder runs, GeneratorTurns where every cache extends, else Reprefill.

    `first`: the step's number of the first episode played (its keys are the step's, not the share's)."""
    if reuse_cache and fixed_decode.supports_fixed_decode(model):
        player = FixedTurns(model, tokenizer, group_size, seed)
    elif reuse_cache and all(type(c) in _EXTENDABLE for c in make_prompt_cache(model)):
        player = GeneratorTurns(model, tokenizer, group_size, seed)
    else:
        player = Reprefill(model, tokenizer, group_size, seed, concurrency)
    player.first = first
    return player
