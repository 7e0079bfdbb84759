"""Grading many completions at once on a pool of threads, and remembering recent grades."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from .. import completion_text
from .grading import DEFAULT, TRAINING, Grade, GradeConfig, grade, require_toolchain
from .testcode import tests_key


def default_workers() -> int:
    # A grade mostly waits (process start-up, ocamlc, the program), outside Python:
    # twice as many threads as cores kept the 2-core test machine busy.
    return max(1, min(8, 2 * (os.cpu_count() or 1)))


def grade_many(
    completions: list,
    problems: list[dict],
    config: GradeConfig = DEFAULT,
    finish_reasons: list | None = None,
    workers: int | None = None,
) -> list[Grade]:
    """Grade completions[i] against problems[i] on a pool of worker threads, in order."""
    reasons = finish_reasons if finish_reasons is not None else [None] * len(completions)
    require_toolchain()
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        return list(
            pool.map(
                lambda args: grade(args[0], args[1], config, args[2]), zip(completions, problems, reasons)
            )
        )


# Grades of recent completions, so the logging rewards (reward_functions.py) do not grade twice.
_recent: OrderedDict = OrderedDict()
_recent_lock = threading.Lock()
_RECENT_MAX = 4096


def _problems(n: int, signature, tests, preamble) -> list[dict]:
    preamble = preamble if preamble is not None else [""] * n
    return [{"signature": s, "tests": t, "preamble": p or ""} for s, t, p in zip(signature, tests, preamble)]


def _key(completion, problem: dict, config: GradeConfig, finish_reason) -> tuple:
    return (
        completion_text(completion),
        problem["signature"],
        tests_key(problem["tests"]),
        problem["preamble"],
        id(config),
        finish_reason,
    )


def grades_for(
    completions: list,
    signature: list,
    tests: list,
    preamble: list | None = None,
    finish_reason: list | None = None,
    config: GradeConfig = TRAINING,
) -> list[Grade]:
    """Grades of a batch of completions, graded in parallel once and remembered for a while."""
    problems = _problems(len(completions), signature, tests, preamble)
    reasons = finish_reason if finish_reason is not None else [None] * len(completions)
    keys = [_key(c, p, config, r) for c, p, r in zip(completions, problems, reasons)]
    with _recent_lock:
        known = {k: _recent[k] for k in keys if k in _recent}
    todo = [i for i, k in enumerate(keys) if k not in known]
    if todo:
        fresh = grade_many(
            [completions[i] for i in todo], [problems[i] for i in todo], config, [reasons[i] for i in todo]
        )
        with _recent_lock:
            for i, g in zip(todo, fresh):
                known[keys[i]] = _recent[keys[i]] = g
            while len(_recent) > _RECENT_MAX:
                _recent.popitem(last=False)
    return [known[k] for k in keys]
