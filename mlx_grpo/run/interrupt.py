"""Ctrl-C during training: the first finishes the step, saves and leaves; a second leaves at once.

The step loop iterates through `steps_until_ctrl_c`, which owns the SIGINT
handler for exactly as long as the loop runs (the generator's `finally`
restores the previous handler however the loop ends), so a library user's
later Ctrl-C behaves as usual.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Callable, Iterable, Iterator


class Interrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C after saving a checkpoint; the message says how to continue."""


def steps_until_ctrl_c(steps: Iterable[int], on_stop: Callable[[int], str]) -> Iterator[int]:
    """Yield `steps`; after a step during which Ctrl-C was pressed, raise Interrupted(on_stop(step)).

    on_stop(step) saves what is needed and returns the line to show. A
    second Ctrl-C raises KeyboardInterrupt at once, wherever the run is (a
    checkpoint being written then is left unfinished, which is safe: the
    previous one stays the newest complete one).
    """
    requested = []

    def handler(signum, frame):
        if requested:
            raise KeyboardInterrupt
        requested.append(True)
        sys.stderr.write(
            "\nCtrl-C: stopping after this step and saving a checkpoint (Ctrl-C again to quit at once)\n"
        )
        sys.stderr.flush()

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, handler) if in_main_thread else None
    try:
        for step in steps:
            yield step
            if requested:
                raise Interrupted(on_stop(step))
    finally:
        if in_main_thread:  # None: the previous handler was not set from Python
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
