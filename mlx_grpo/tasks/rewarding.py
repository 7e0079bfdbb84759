"""Calling reward functions safely and combining them.

A reward function has the common shape

    fn(prompts, completions, **dataset_columns) -> list[float | None]

with one entry per completion; None means "not applicable" and is left out of
the sum (not counted as zero). R_i = sum_k w_k * r_k(q, o_i).

A function that raises, hangs (see with_timeout), or returns the wrong number
of values, NaN or non-numbers is recorded as an error for the examples it
failed on: their scores become None and training goes on. A function that
fails on every example stops the run (RewardError): nothing could be learnt.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

RewardFn = Callable[..., list]


def load_reward_functions(path: str | Path, names: list[str]) -> list[RewardFn]:
    """Import `path` as a module and return its functions called `names`."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"mlx_grpo_user_rewards_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import reward file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file: report, don't crash with a traceback
        raise ValueError(f"reward file {path} failed to import: {type(e).__name__}: {e}") from e
    functions = []
    for name in names:
        fn = getattr(module, name, None)
        if not callable(fn):
            available = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
            raise ValueError(
                f"reward file {path} has no function {name!r}; it defines: {', '.join(available) or 'none'}"
            )
        functions.append(fn)
    return functions


def reward_name(fn: RewardFn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _accepted_columns(fn: RewardFn, columns: dict) -> dict:
    """All columns for a **kwargs function, else only the ones it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return columns
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return columns
    names = {p.name for p in params}
    return {k: v for k, v in columns.items() if k in names}


@dataclass
class Scores:
    total: np.ndarray  # (N,) weighted sum of the applicable parts
    parts: dict[str, list]  # name -> N values (float or None)
    errors: dict[str, int] = field(default_factory=dict)  # name -> examples it failed to score this batch
    error_examples: dict[str, str] = field(default_factory=dict)  # name -> the first failure and its example


class RewardError(RuntimeError):
    """A reward function failed on every example: training on it would learn nothing."""


class RewardTimeout(Exception):
    """A reward call did not return within the time limit."""


def with_timeout(fn: RewardFn, seconds: float | None) -> RewardFn:
    """`fn`, but a call that takes longer than `seconds` raises RewardTimeout.

    The call runs in a daemon thread. Python cannot stop a thread, so a call
    that hangs is abandoned, not killed: it keeps running in the background
    (using CPU if it is busy, holding whatever it holds) until it returns or
    the process ends. That is the price of keeping rewards in-process (no
    pickling of reward functions or dataset columns). None or 0: no limit.
    A function that says `no_timeout = True` (the judge, whose MLX decode must
    not be left running in a thread, and which max_tokens bounds) is left as is,
    and so is one already bounded by this limit (a task guarded again for another model).
    """
    if not seconds or getattr(fn, "no_timeout", False) or getattr(fn, "timeout_seconds", None) == seconds:
        return fn

    @functools.wraps(fn)  # keeps __name__ and, through __wrapped__, the signature
    def timed(*args, **kwargs):
        box = {}

        def run():
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as e:  # reported in the caller's thread
                box["error"] = e

        worker = threading.Thread(target=run, daemon=True, name=f"reward-{reward_name(fn)}")
        worker.start()
        worker.join(seconds)
        if worker.is_alive():
            raise RewardTimeout(f"timed out after {seconds:g}s (the call was abandoned)")
        if "error" in box:
            error = box["error"]
            raise error if isinstance(error, Exception) else RuntimeError(f"raised {type(error).__name__}")
        return box["value"]

    timed.timeout_seconds = seconds
    return timed


def _check_shape(values, n: int) -> list:
    if not isinstance(values, (list, tuple, np.ndarray)):
        raise TypeError(f"returned {type(values).__name__}, expected a list")
    if len(values) != n:
        raise ValueError(f"returned {len(values)} values for {n} completions")
    return list(values)


def _value(v) -> float | None:
    """One score: a finite number or None; anything else raises with what it was."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"returned a non-number {v!r:.60}")
    if not math.isfinite(float(v)):
        raise ValueError(f"returned {float(v)}")
    return float(v)


def _short(x, limit: int = 80) -> str:
    text = x if isinstance(x, str) else repr(x)
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


# After this many timed-out single-example calls, the rest of the batch is not tried:
# a function that hangs on everything would otherwise cost one timeout per example.
_MAX_TIMEOUTS_PER_BATCH = 2


def _score_one_function(fn: RewardFn, prompts: list, completions: list[str], columns: dict):
    """Scores of one function: (values, failures, note), failures = [(index, reason)].

    The batch is called once. If that call fails as a whole (raises, times out,
    wrong length), each example is called alone, so one bad example costs only
    its own score and the failure names it. note: set when the batch call
    failed but every example then scored alone (nothing lost, but it costs time).
    """
    n = len(completions)
    kwargs = _accepted_columns(fn, columns)
    try:
        raw = _check_shape(fn(prompts, completions, **kwargs), n)
    except (Exception, SystemExit) as e:  # user code: any failure is data, not a crash
        batch_error = e
    else:
        values, failures = [], []
        for i, v in enumerate(raw):
            try:
                values.append(_value(v))
            except (TypeError, ValueError) as e:
                values.append(None)
                failures.append((i, str(e)))
        return values, failures, None

    values, failures, timeouts = [], [], 0
    for i in range(n):
        if timeouts >= _MAX_TIMEOUTS_PER_BATCH:
            values.append(None)
            failures.append((i, f"not scored: {timeouts} single-example calls timed out first"))
            continue
        try:
            (value,) = _check_shape(
                fn([prompts[i]], [completions[i]], **{k: [v[i]] for k, v in kwargs.items()}), 1
            )
            values.append(_value(value))
        except (Exception, SystemExit) as e:
            timeouts += isinstance(e, RewardTimeout)
            values.append(None)
            failures.append((i, _describe(e)))
    note = f"the call on all {n} failed ({_describe(batch_error)}); each example was then scored alone"
    return values, failures, None if failures else note


def score_completions(
    functions: list[RewardFn],
    weights: list[float],
    prompts: list,
    completions: list[str],
    columns: dict[str, list],
) -> Scores:
    """Score N completions. prompts and every column list have N entries.

    A function that fails on some examples (raises, hangs past its timeout,
    returns NaN, a non-number, or the wrong number of values) gives None for
    those; the failures are counted and the first is kept with its example.
    A function that fails on every example raises RewardError.
    """
    n = len(completions)
    total = np.zeros(n)
    parts, errors, examples = {}, {}, {}
    for fn, weight in zip(functions, weights):
        name = reward_name(fn)
        values, failures, note = _score_one_function(fn, prompts, completions, columns)
        if note:  # nothing lost: no failed example, but the note is logged
            errors[name], examples[name] = 0, note
        if failures:
            i, reason = failures[0]
            errors[name] = len(failures)
            examples[name] = f"{reason} (prompt {_short(prompts[i])}, completion {_short(completions[i])})"
            if len(failures) == n:
                raise RewardError(f"reward {name!r} failed on all {n} completions, e.g. {examples[name]}")
        parts[name] = values
        total += np.array([weight * v if v is not None else 0.0 for v in values])
    return Scores(total=total, parts=parts, errors=errors, error_examples=examples)


def part_means(parts: dict[str, list]) -> dict[str, float | None]:
    out = {}
    for name, values in parts.items():
        applicable = [v for v in values if v is not None]
        out[name] = float(np.mean(applicable)) if applicable else None
    return out


def reward_metrics(functions: list[RewardFn]) -> dict:
    """Metrics reward functions keep themselves (`pop_metrics`: a judge's time and unreadable answers)."""
    out = {}
    for fn in functions:
        if callable(getattr(fn, "pop_metrics", None)):
            out.update(fn.pop_metrics())
    return out
