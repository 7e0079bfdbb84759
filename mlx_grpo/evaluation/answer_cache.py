"""Answers kept between `eval` and `compare` runs: a model is not asked the same thing twice.

Three seeds of a recipe compared against one base model would decode the base's
answers three times (on GSM8K's 1,319 test problems, most of an hour each on a
2-core CPU). Answers are the same whenever everything that decides them is the
same, so each model's answers are written to the cache folder (models/gguf.py:
$MLX_GRPO_CACHE, else ~/.cache/mlx-grpo) as answers/<key>.json, and read back
instead of decoding.

The key hashes everything the answers depend on: the model's and the adapter's
files (path, and each file's name, size and modification time), the prompts as
the task frames them (the rows' prompts, system prompt, plain-text frame, stop
strings), the sampling settings, samples per prompt, seed and decode width, and
MLX's version and device. Scores are not cached: the rewards run again on the
kept text, so a changed reward function scores old answers anew.

Multi-turn tasks are never cached: their answers depend on an environment.
`MLX_GRPO_ANSWER_CACHE` names another folder for the answers alone (the tests
give each test its own).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import mlx.core as mx

from ..files import CheckpointError, atomic_write_json
from ..models.gguf import CONVERTER_VERSION, cache_root
from ..models.loading import model_fingerprint

FORMAT = 1  # bump when what is kept, or how answers are decoded for the same key, changes
ENV = "MLX_GRPO_ANSWER_CACHE"


def folder() -> Path:
    return Path(os.environ.get(ENV) or cache_root() / "answers")


def cache_key(spec, task, rows: list[dict], settings) -> str:
    """The name answers of `spec` to `rows` under `settings` are kept under."""
    sampling = settings.sampling
    parts = [
        FORMAT, CONVERTER_VERSION, mx.__version__, str(mx.default_device()),
        model_fingerprint(spec.model), model_fingerprint(spec.adapter) if spec.adapter else None,
        task.system_prompt, getattr(task, "prompt_format", None), list(getattr(task, "stop", []) or []),
        [r["prompt"] for r in rows],
        [sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.max_tokens],
        settings.samples, settings.seed, settings.concurrency,
    ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def read(key: str, count: int) -> tuple[list[dict], float] | None:
    """(answers as dicts, the seconds their decoding took), or None when none fit."""
    try:
        kept = json.loads((folder() / f"{key}.json").read_text(encoding="utf-8"))
        answers, seconds = kept["answers"], float(kept["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(answers, list) or len(answers) != count or not all(isinstance(a, dict) for a in answers):
        return None
    return answers, seconds


def write(key: str, answers: list[dict], seconds: float) -> Path | None:
    """Keep answers under key; None when the folder cannot be written (the next run decodes again)."""
    path = folder() / f"{key}.json"
    try:
        atomic_write_json(path, {"format": FORMAT, "seconds": seconds, "answers": answers})
    except CheckpointError:
        return None
    return path
