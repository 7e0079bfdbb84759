"""Where the tiny web model lives, once scripts/build_tiny_web_model.py has built it."""

from __future__ import annotations

from pathlib import Path

TINY_WEB_MODEL = Path(__file__).resolve().parent / "assets" / "tiny-web"

# The run `mlx-grpo train --task web` makes with the tiny web model: the kind it was
# pre-trained on, no system prompt (it never saw one), two-turn episodes with room to spare.
TINY_WEB_SETTINGS: dict = {
    "web_kinds": ["fact/1"],
    "system_prompt": "",
    "max_tokens": 12,
    "max_turns": 3,
    "max_episode_tokens": 256,
    "lr": 2e-4,
    "steps": 40,
    "batch_size": 8,
    "group_size": 8,
    "warmup_steps": 2,
    "micro_batch_size": 64,
    "eval_num_problems": 32,
    "save_every": 20,
}


def tiny_web_model() -> Path | None:
    return TINY_WEB_MODEL if (TINY_WEB_MODEL / "config.json").exists() else None
