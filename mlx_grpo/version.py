"""The package's version: pyproject.toml's, read from the installed package's metadata.

pyproject.toml is the one place it is written; `mlx_grpo.__version__` and what eval and compare
record with the answers they keep (evaluation/answer_cache.py) both read it here.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "mlx-grpo"


def package_version() -> str:
    """The installed version, or "unknown" for a source tree run without being installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"
