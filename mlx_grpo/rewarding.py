"""Calling reward functions safely and combining them.

A reward function has the common shape

    fn(prompts, completions, **dataset_columns) -> list[float | None]

with one entry per completion; None means "not applicable" and is left out of
the sum (not counted as zero). R_i = sum_k w_k * r_k(q, o_i).

A function that raises, or returns the wrong number of values, or values that
are not numbers, is recorded as an error for that call: its scores become None
and training goes on.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
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
            raise ValueError(f"reward file {path} has no function {name!r}; it defines: {', '.join(available) or 'none'}")
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
    errors: dict[str, int] = field(default_factory=dict)  # name -> failed calls this batch
    error_examples: dict[str, str] = field(default_factory=dict)


def _clean(values, n: int) -> list:
    if not isinstance(values, (list, tuple, np.ndarray)):
        raise TypeError(f"returned {type(values).__name__}, expected a list")
    if len(values) != n:
        raise ValueError(f"returned {len(values)} values for {n} completions")
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"returned a non-number {v!r}")
        out.append(float(v) if math.isfinite(float(v)) else None)
    return out


def score_completions(functions: list[RewardFn], weights: list[float], prompts: list, completions: list[str],
                      columns: dict[str, list]) -> Scores:
    """Score N completions. prompts and every column list have N entries."""
    n = len(completions)
    total = np.zeros(n)
    parts, errors, examples = {}, {}, {}
    for fn, weight in zip(functions, weights):
        name = reward_name(fn)
        try:
            values = _clean(fn(prompts, completions, **_accepted_columns(fn, columns)), n)
        except Exception as e:  # any failure of user code is data, not a crash
            errors[name] = errors.get(name, 0) + 1
            examples.setdefault(name, f"{type(e).__name__}: {e}")
            values = [None] * n
        parts[name] = values
        total += np.array([weight * v if v is not None else 0.0 for v in values])
    return Scores(total=total, parts=parts, errors=errors, error_examples=examples)


def part_means(parts: dict[str, list]) -> dict[str, float | None]:
    out = {}
    for name, values in parts.items():
        applicable = [v for v in values if v is not None]
        out[name] = float(np.mean(applicable)) if applicable else None
    return out
