"""Where the tiny web model lives, once scripts/build_tiny_web_model.py has built it."""

from __future__ import annotations

from pathlib import Path

TINY_WEB_MODEL = Path(__file__).resolve().parent / "assets" / "tiny-web"

# Settings for the tiny web model (the build script measures what they give).
TINY_WEB_SETTINGS: dict = {}


def tiny_web_model() -> Path | None:
    return TINY_WEB_MODEL if (TINY_WEB_MODEL / "config.json").exists() else None
