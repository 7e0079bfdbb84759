"""MLX's plainest batched decode loop, timed: the ceiling a rollout's decode is measured against.

bench.py (--limits: the bare loop at the rollout's width) and decode_ceiling.py (ours against it
at several widths) both time it; it lives here so that neither imports the other.
"""

from __future__ import annotations

import time

import mlx.core as mx


def bare_loop(model, prompt: list[int], width: int, tokens: int) -> float:
    """Seconds a step of MLX's plainest batched decode: prompt cache, argmax, async_eval."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array([prompt[:-1]] * width), cache=cache)
    mx.eval([c.state for c in cache])
    y = mx.array([[prompt[-1]]] * width)

    def step(y):
        return mx.argmax(model(y, cache=cache)[:, -1], axis=-1)[:, None]

    y = step(y)
    mx.async_eval(y)
    began = None
    for t in range(tokens):
        if t == 1:  # the first step compiles nothing but warms the caches: leave it out
            mx.eval(y)
            began = time.perf_counter()
        nxt = step(y)
        mx.async_eval(nxt)
        y.tolist()  # read this step's tokens, as any decode loop must
        y = nxt
    mx.eval(y)
    return (time.perf_counter() - began) / (tokens - 1)
