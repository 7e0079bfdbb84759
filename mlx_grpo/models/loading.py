"""Loading a policy: the embedded tiny model, a local mlx-lm folder, or a Hugging Face id."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from mlx_lm.utils import load as mlx_lm_load

EMBEDDED_MODEL = "embedded"


def embedded_model_path() -> Path:
    """Folder of the tiny arith model that ships inside the package."""
    return Path(str(resources.files("mlx_grpo") / "assets" / "tiny-arith"))


def resolve_model_path(model: str | None) -> str:
    if model in (None, "", EMBEDDED_MODEL):
        return str(embedded_model_path())
    return model


def load_policy(model: str | None = None, adapter_path: str | None = None):
    """Load (model, tokenizer) from a local folder or a Hugging Face repo id.

    `model=None` loads the embedded tiny model. With `adapter_path`, the
    adapters found there are applied (mlx-lm's format).
    """
    path = resolve_model_path(model)
    if not Path(path).exists() and ("/" not in path or path.startswith((".", "/", "~"))):
        raise FileNotFoundError(f"model not found: {path} (neither a folder nor a Hugging Face repo id)")
    return mlx_lm_load(path, adapter_path=adapter_path)
