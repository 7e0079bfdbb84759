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
strings), the sampling settings, samples per prompt, seed and decode width,
MLX's version and device, and the code that decodes: mlx-grpo's version and the
decode format (sampling/rollout.py's DECODE_FORMAT, bumped whenever what a model
answers changes). Each entry also records which mlx-grpo made it, and a reuse
says so. Scores are not cached: the rewards run again on the kept text, so a
changed reward function scores old answers anew.

Multi-turn tasks are never cached: their answers depend on an environment.
`MLX_GRPO_ANSWER_CACHE` names another folder for the answers alone (the tests
give each test its own).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import NamedTuple

import mlx.core as mx

from ..files import CheckpointError, atomic_write_json
from ..models.gguf import CONVERTER_VERSION, cache_root
from ..models.loading import model_fingerprint
from ..sampling import rollout as decoding
from ..version import package_version

FORMAT = 2  # bump when what a cache file keeps changes (how answers are decoded is DECODE_FORMAT's)
ENV = "MLX_GRPO_ANSWER_CACHE"


class Kept(NamedTuple):
    """Answers read back: as dicts, the seconds their decoding took, and which code made them."""

    answers: list[dict]
    seconds: float
    made_by: str  # "mlx-grpo 0.1.0 (decode format 1)"


def made_by(version: str, decode_format) -> str:
    return f"mlx-grpo {version} (decode format {decode_format})"


def folder() -> Path:
    return Path(os.environ.get(ENV) or cache_root() / "answers")


def cache_key(spec, task, rows: list[dict], settings) -> str:
    """The name answers of `spec` to `rows` under `settings` are kept under."""
    sampling = settings.sampling
    parts = [
        FORMAT, package_version(), decoding.DECODE_FORMAT, CONVERTER_VERSION, mx.__version__, str(mx.default_device()),
        model_fingerprint(spec.model), model_fingerprint(spec.adapter) if spec.adapter else None,
        task.system_prompt, getattr(task, "prompt_format", None), list(getattr(task, "stop", []) or []),
        [r["prompt"] for r in rows],
        [sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.max_tokens],
        settings.samples, settings.seed, settings.concurrency, getattr(settings, "keep_quantized", False),
    ]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def read(key: str, count: int) -> Kept | None:
    """The answers kept under key, or None when none fit."""
    try:
        kept = json.loads((folder() / f"{key}.json").read_text(encoding="utf-8"))
        answers, seconds, maker = kept["answers"], float(kept["seconds"]), kept["made_by"]
        by = made_by(maker["mlx_grpo"], maker["decode_format"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(answers, list) or len(answers) != count or not all(isinstance(a, dict) for a in answers):
        return None
    return Kept(answers, seconds, by)


def write(key: str, answers: list[dict], seconds: float) -> Path | None:
    """Keep answers under key; None when the folder cannot be written (the next run decodes again)."""
    path = folder() / f"{key}.json"
    try:
        maker = {"mlx_grpo": package_version(), "decode_format": decoding.DECODE_FORMAT}
        atomic_write_json(path, {"format": FORMAT, "made_by": maker, "seconds": seconds, "answers": answers})
    except CheckpointError:
        return None
    return path
