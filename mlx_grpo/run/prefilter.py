"""The optional pre-pass (`prefilter: K`): train on the prompts the base model sometimes solves.

GRPO learns from a group only when its completions differ in reward. A prompt
the model never solves gives a group of equally wrong answers, one it always
solves a group of equally right ones: neither teaches the main reward, and
where right answers are rare the first kind is most of the data (SmolLM2-135M
on GSM8K: about one problem in ten has a right answer among 8 samples; issue
27). The pre-pass samples K answers to each training prompt from the base
model, at the run's sampling settings, judges them with the task's accuracy
reward (right as tasks/accuracy.py judges it, as pass@k counts), and keeps the prompts whose pass
rate is strictly between 0 and 1.

It costs K completions a prompt, so `prefilter_prompts` bounds how many prompts
it samples (taken in the order the run's first pass over the data would draw
them), and the pass rates are cached in the cache folder (models/gguf.py:
$MLX_GRPO_CACHE, else ~/.cache/mlx-grpo) as prefilter/<key>.json. The key
hashes the model (its path, and its files' sizes and times), the prompts as
framed for it and their rows, the accuracy reward, K and the sampling
settings: a run started again, resumed, or compared with another `shaping`
reuses them. Its sampling seed is fixed (not the run's), so the same data
gives the same prompts whatever the run's seed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import numpy as np

from ..config import ConfigError, TrainConfig
from ..files import CheckpointError, atomic_write_json
from ..models.gguf import cache_root
from ..models.loading import model_fingerprint
from ..sampling.kinds import rollouts_for
from ..sampling.rollout import SamplingConfig, sample_completions
from ..tasks.accuracy import accuracy_values, right
from ..tasks.data import DataError, task_prompts
from ..tasks.rewarding import reward_name

FORMAT = 1  # bump when what the cache holds, or how it is computed, changes
SEED = 0x50F17E  # the pre-pass's own sampling seed


def pass_rates(
    model,
    tokenizer,
    task,
    rows: list[dict],
    ids: list[int],
    k: int,
    sampling: SamplingConfig,
    concurrency: int,
) -> np.ndarray:
    """The fraction of k sampled answers to each row that the task's accuracy reward calls right.

    Row i's answers are keyed by (SEED, ids[i], member), so a prompt gets the same
    answers in whatever chunk it is sampled."""
    model.eval()
    chunk = max(1, concurrency // k)
    rates = []
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        completions = sample_completions(
            model,
            tokenizer,
            task_prompts(tokenizer, task, part),
            k,
            sampling,
            concurrency,
            seed=SEED,
            prompt_ids=ids[start : start + chunk],
        )
        judged = right(accuracy_values(task, part, k, completions)).astype(float)
        rates += list(judged.reshape(len(part), k).mean(axis=1))
    return np.array(rates)


def cache_key(config: TrainConfig, task, tokenizer, rows: list[dict]) -> str:
    sampling = [*dataclasses.astuple(config.sampling), config.stop]
    reward_file = (
        hashlib.sha256(Path(config.reward_file).read_bytes()).hexdigest() if config.reward_file else None
    )
    parts = [
        FORMAT,
        model_fingerprint(config.model),
        task.name,
        reward_name(task.accuracy_reward),
        reward_file,
        config.prefilter,
        sampling,
        task_prompts(tokenizer, task, rows),
        rows,
    ]
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def prefilter_train_rows(model, tokenizer, task, config: TrainConfig) -> str:
    """Replace task.train_rows by the prompts whose base-model pass rate is strictly between 0 and 1.

    Returns the line that says what was kept (and whether the rates came from the cache)."""
    k = config.prefilter
    if rollouts_for(task).plays_episodes or task.accuracy_reward is None:
        raise ConfigError(
            f"--prefilter needs a task with a checkable answer (an accuracy reward); "
            f"task {task.name!r} has none"
        )
    order = np.random.default_rng([config.seed, 0]).permutation(len(task.train_rows))  # the run's first pass
    if config.prefilter_prompts:
        order = order[: config.prefilter_prompts]
    rows = [task.train_rows[int(i)] for i in order]
    path = cache_root() / "prefilter" / f"{cache_key(config, task, tokenizer, rows)}.json"
    start = time.perf_counter()
    rates = _read(path, len(rows))
    from_cache = rates is not None
    if not from_cache:
        rates = pass_rates(
            model,
            tokenizer,
            task,
            rows,
            [int(i) for i in order],
            k,
            config.sampling,
            config.decode_concurrency,
        )
        try:
            atomic_write_json(path, {"k": k, "prompts": len(rows), "pass_rates": [float(r) for r in rates]})
        except (
            CheckpointError
        ):  # a cache that cannot be written costs the next run time, not this one its result
            pass
    rates = np.asarray(rates, dtype=float)
    keep = (rates > 0) & (rates < 1)
    never, always = int((rates == 0).sum()), int((rates == 1).sum())
    if not keep.any():
        raise DataError(
            f"--prefilter {k}: no training prompt was solved in some but not all of {k} samples "
            f"({never} never, {always} always, of {len(rows)}): GRPO has nothing to learn from them; "
            "try more samples, a higher temperature or easier prompts"
        )
    task.train_rows = [row for row, kept in zip(rows, keep) if kept]
    how = f"from the cache {path}" if from_cache else f"sampled in {time.perf_counter() - start:.0f}s"
    return (
        f"prefilter: kept {len(task.train_rows)} of {len(rows)} training prompts, solved in some but not all "
        f"of {k} base-model samples ({never} never, {always} always solved; {how})"
    )


def _read(path: Path, count: int) -> list[float] | None:
    """The cached pass rates, or None when there are none (or they are unreadable or do not fit)."""
    try:
        rates = json.loads(path.read_text(encoding="utf-8"))["pass_rates"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rates if isinstance(rates, list) and len(rates) == count else None
