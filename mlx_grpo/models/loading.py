"""Loading a policy: the embedded tiny model, a local mlx-lm folder, a GGUF file, a packaged
model's alias (smollm2-135m), a model in Ollama's or LM Studio's store (ollama:NAME[:TAG],
lmstudio:PUBLISHER/REPO[/FILE]: stores.py), or a Hugging Face id."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from mlx_lm.utils import load as mlx_lm_load

from .aliases import PACKAGED_MODELS, ModelNotInstalled, packaged_model_path
from .cpu_math import use_fast_swiglu
from .cuda_fixes import apply_cuda_fixes
from .gguf import GGUFError, converted_folder, is_gguf, types_note
from .quantized import prepare_base
from .stores import StoreError, is_store_name, resolve_store_name

__all__ = [
    "EMBEDDED_MODEL",
    "PACKAGED_MODELS",
    "GGUFError",
    "ModelNotInstalled",
    "StoreError",
    "embedded_model_path",
    "gguf_types_note",
    "load_policy",
    "load_with_config",
    "model_fingerprint",
    "model_folder",
    "resolve_model_path",
]

EMBEDDED_MODEL = "embedded"


def embedded_model_path() -> Path:
    """Folder of the tiny arith model that ships inside the package."""
    return Path(str(resources.files("mlx_grpo") / "assets" / "tiny-arith"))


def resolve_model_path(model: str | None) -> str:
    """The folder, GGUF file or Hugging Face id a model name stands for (aliases, store names and
    "embedded" resolved)."""
    if model in (None, "", EMBEDDED_MODEL):
        return str(embedded_model_path())
    if model in PACKAGED_MODELS:
        return str(packaged_model_path(model))
    if is_store_name(model):
        return str(resolve_store_name(model))
    return model


def model_fingerprint(model: str | None) -> list:
    """The model's path and, for local files, each file's name, size and modification time."""
    path = resolve_model_path(model)
    local = Path(path).expanduser()
    files = sorted(local.iterdir()) if local.is_dir() else [local] if local.is_file() else []
    return [path, *[(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()]]


def model_folder(model: str | None) -> str:
    """What mlx-lm loads for a model name: a GGUF file's converted folder (see gguf.py), else the path or
    id."""
    path = resolve_model_path(model)
    if is_gguf(path) or Path(path).expanduser().is_file():  # a model in one file can only be a GGUF file
        return str(converted_folder(path))
    if not Path(path).expanduser().exists() and ("/" not in path or path.startswith((".", "/", "~"))):
        raise FileNotFoundError(
            f"model not found: {path} (neither a folder, a .gguf file nor a Hugging Face "
            f"repo id; packaged models: {', '.join(PACKAGED_MODELS)})"
        )
    return path


def gguf_types_note(model: str | None) -> str | None:
    """How a GGUF model's tensor types were carried ("GGUF tensors: Q4_K x12: kept 4-bit (exact); ..."), else
    None."""
    path = resolve_model_path(model)
    if not (is_gguf(path) or Path(path).expanduser().is_file()):
        return None
    return types_note(converted_folder(path))


def load_with_config(model: str | None = None, adapter_path: str | None = None):
    """(model, tokenizer, config.json dict) of a model name, as load_policy loads it."""
    folder = model_folder(model)
    tokenizer_config = None
    if folder != resolve_model_path(model):  # converted from GGUF: its tokenizer.json is exactly the file's
        # Left to itself, transformers swaps in its own tokenizer class for some model types (qwen2:
        # Qwen's split and an NFC normaliser), which need not be how the GGUF file tokenizes.
        from transformers import PretrainedConfig

        tokenizer_config = {"config": PretrainedConfig()}
    model, tokenizer, config = mlx_lm_load(
        folder, adapter_path=adapter_path, tokenizer_config=tokenizer_config, return_config=True
    )
    use_fast_swiglu(model)
    return apply_cuda_fixes(model), tokenizer, config


def load_policy(model: str | None = None, adapter_path: str | None = None, keep_quantized: bool = False):
    """Load (model, tokenizer) from a local folder, a GGUF file, an alias or a Hugging Face repo id.

    `model=None` loads the embedded tiny model. With `adapter_path`, the
    adapters found there are applied (mlx-lm's format). A quantized model is
    run on a float32 copy on the CPU backend when it fits (see quantized.py),
    unless `keep_quantized`.
    """
    policy, tokenizer, _ = load_with_config(model, adapter_path)
    if not keep_quantized:
        prepare_base(policy)
    return policy, tokenizer
