"""Batched sampling of completion groups with mlx-lm's BatchGenerator.

Every prompt x group member is decoded concurrently (up to `concurrency`
sequences at once). Each prompt is prefilled once and its KV cache handed to
all G members of its group, instead of G identical prefills. For each
completion we keep exactly what the policy gradient needs: the sampled token
ids (never decoded and re-encoded), each token's behaviour log-prob at the
sampling temperature, and why it stopped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 64


@dataclass
class Completion:
    prompt_index: int  # index into the prompts passed to `sample_completions`
    prompt_tokens: list[int]
    tokens: list[int]  # sampled ids, including the end token when it stopped
    logprobs: list[float]  # behaviour log mu(token) at the sampling temperature
    finish_reason: str  # "stop" (end token) or "length" (hit max_tokens)
    text: str  # decoded completion, end token left out


def _end_token_ids(tokenizer) -> list[int]:
    ids = getattr(tokenizer, "eos_token_ids", None) or [tokenizer.eos_token_id]
    return sorted({int(i) for i in ids if i is not None})


def _tempered_logprobs(raw_logprobs: list[mx.array], tokens: list[int], temperature: float) -> mx.array:
    """log softmax(logits / T)[token] from the generator's log softmax(logits).

    log softmax is shift-invariant, so dividing the generator's normalised
    log-probs by T and renormalising equals log softmax(logits / T).
    """
    logprobs = mx.stack(raw_logprobs).astype(mx.float32)
    idx = mx.array(tokens)[:, None]
    if temperature not in (0.0, 1.0):
        logprobs = logprobs / temperature
        logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
    return mx.take_along_axis(logprobs, idx, axis=-1).squeeze(-1)


def _prefilled_cache(model, prompt: list[int]):
    """KV cache of the prompt minus its last token (the generator feeds that one)."""
    cache = make_prompt_cache(model)
    if len(prompt) > 1:
        model(mx.array([prompt[:-1]]), cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def _shared_caches(model, prompts: list[list[int]], group_size: int):
    """One prefill per prompt; each group member gets its own copy of the result."""
    caches = []
    for prompt in prompts:
        cache = _prefilled_cache(model, prompt)
        for _ in range(group_size):
            caches.append(copy.deepcopy(cache))
    return caches


def sample_completions(
    model,
    tokenizer,
    prompts: list[list[int]],
    group_size: int,
    sampling: SamplingConfig,
    concurrency: int = 256,
) -> list[Completion]:
    """Sample `group_size` completions per prompt; returned grouped by prompt.

    The result is ordered [p0 c0..c(G-1), p1 c0..c(G-1), ...]. The sampler draws
    from MLX's global random state: seed it (mx.random.seed) for a repeatable run.
    temperature 0 decodes greedily.
    """
    sampler = make_sampler(
        temp=sampling.temperature,
        top_p=sampling.top_p if 0 < sampling.top_p < 1 else 0.0,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
    )
    end_ids = _end_token_ids(tokenizer)
    flat_prompts = [p for p in prompts for _ in range(group_size)]
    generator = BatchGenerator(
        model,
        max_tokens=sampling.max_tokens,
        stop_tokens=[[i] for i in end_ids],
        sampler=sampler,
        completion_batch_size=concurrency,
        prefill_batch_size=min(concurrency, len(flat_prompts)),
    )
    try:
        uids = generator.insert(
            [p[-1:] for p in flat_prompts],
            caches=_shared_caches(model, prompts, group_size),
            all_tokens=[list(p[:-1]) for p in flat_prompts],
        )
        position = {uid: i for i, uid in enumerate(uids)}
        tokens = [[] for _ in flat_prompts]
        logprobs = [[] for _ in flat_prompts]
        finish = [None] * len(flat_prompts)
        while any(f is None for f in finish):
            responses = generator.next_generated()
            if not responses:
                raise RuntimeError("the batch generator stopped before every completion finished")
            step_tokens = [r.token for r in responses]
            step_logprobs = _tempered_logprobs(
                [r.logprobs for r in responses], step_tokens, sampling.temperature
            ).tolist()
            for r, lp in zip(responses, step_logprobs):
                i = position[r.uid]
                tokens[i].append(r.token)
                logprobs[i].append(lp)
                if r.finish_reason is not None:
                    finish[i] = r.finish_reason
    finally:
        generator.close()

    completions = []
    for i, prompt in enumerate(flat_prompts):
        body = tokens[i][:-1] if finish[i] == "stop" else tokens[i]
        completions.append(
            Completion(
                prompt_index=i // group_size,
                prompt_tokens=list(prompt),
                tokens=tokens[i],
                logprobs=logprobs[i],
                finish_reason=finish[i],
                text=tokenizer.decode(body),
            )
        )
    return completions
