"""Who hears where a rollout is, and what a single-turn decode tells them.

The live display of train, eval and compare sets PROGRESS, so that the layers
between need not pass a callback on. A multi-turn rollout sends its turn's
totals (multiturn._Progress); a single-turn decode sends a DecodeMeter state a
few times a second: completions done, tokens, tokens/s, and the most time it
can still take (every unfinished row running to max_tokens at the current pace).
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Callable

PROGRESS: ContextVar[Callable[[dict], None] | None] = ContextVar("rollout_progress", default=None)
_EVERY_S = 0.5  # the most often a decode reports


class DecodeMeter:
    """A single-turn decode's running totals over its waves, sent to `callback`."""

    def __init__(self, rows: int, max_tokens: int, callback: Callable[[dict], None]):
        self.rows, self.max_tokens, self.callback = rows, max_tokens, callback
        self.began = self.wave_began = time.perf_counter()
        self.done = self.tokens = 0  # over the waves that ended
        self.last = 0.0
        self.first_token_at = None

    def step(self, wave_rows: int, position: int, finished: int, tokens: int, ended: bool = False) -> None:
        """After a decode step of a wave of `wave_rows` rows: `position` tokens in, `finished` of its rows
        ended, `tokens` sampled in it so far. `ended` closes the wave."""
        now = time.perf_counter()
        if position == 1 and not ended:
            self.first_token_at = now  # the pace is taken after the prefill (and a first compile)
        if not ended and now - self.last < _EVERY_S:
            return
        self.last = now
        per_step = (
            (now - self.first_token_at) / (position - 1)
            if position > 1 and self.first_token_at
            else (now - self.wave_began) / max(1, position)
        )
        if ended:
            self.done, self.tokens, self.wave_began = self.done + wave_rows, self.tokens + tokens, now
            self.first_token_at = None
            done, tokens, steps_left = self.done, self.tokens, 0
        else:
            done, tokens, steps_left = self.done + finished, self.tokens + tokens, self.max_tokens - position
        later_waves = -(-(self.rows - self.done - (0 if ended else wave_rows)) // max(1, wave_rows))
        seconds = now - self.began
        self.callback(
            {
                "kind": "decode",
                "rows": self.rows,
                "done": done,
                "tokens": tokens,
                "position": position,
                "max_tokens": self.max_tokens,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
                "at_most_left_s": per_step * (steps_left + later_waves * self.max_tokens),
            }
        )
