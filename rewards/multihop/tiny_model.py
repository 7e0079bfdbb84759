"""Where the tiny tool model lives, once scripts/build_tiny_tool_model.py has built it."""

from __future__ import annotations

from pathlib import Path

TINY_TOOL_MODEL = Path(__file__).resolve().parent / "assets" / "tiny-tools"

# The run `mlx-grpo train --task multihop` makes with the tiny tool model: the one chain of 2-hop
# questions it was pre-trained on ("In which country is COMPANY based?"), short turns (a call or an
# answer), three turns with room to spare.
TINY_TOOL_SETTINGS: dict = {
    "multihop_hops": [2],
    "multihop_chains": ["city/country"],
    "max_tokens": 32,
    "max_turns": 4,
    "max_episode_tokens": 320,
    "lr": 2e-4,
    "steps": 30,
    "batch_size": 8,
    "group_size": 8,
    "warmup_steps": 2,
    "micro_batch_size": 64,
    "eval_num_problems": 64,
    "save_every": 15,
}


def tiny_tool_model() -> Path | None:
    return TINY_TOOL_MODEL if (TINY_TOOL_MODEL / "config.json").exists() else None
