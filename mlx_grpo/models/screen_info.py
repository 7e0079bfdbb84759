"""What screening a task's rows needs of a model, read from its files without loading its weights.

Screening (tasks/data.py's screen_task) needs the tokenizer, to count a prompt's tokens, and the
context length, to know how many fit. Both are in the model's folder: the tokenizer files and
config.json. They are read here as load_policy (loading.py) reads them, so they are the very
tokenizer and `model.args.max_position_embeddings` a load gives: the tokenizer by mlx-lm's own
load_tokenizer with the same options, the context through the architecture's ModelArgs (which
supplies its default where config.json has none). A GGUF file is converted to its folder as a
load converts it (once, cached: gguf.py); a Hugging Face id fetches only its JSON and tokenizer
files. Adapters change neither the tokenizer nor the context, so a base model's answer is its
adapted models' too.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING, MODEL_REMAPPING, load_config, load_tokenizer

from .loading import model_folder, resolve_model_path

__all__ = ["context_length", "read_tokenizer"]

# The files mlx-lm's load_tokenizer fetches for a Hugging Face id (config.json among them).
_TOKENIZER_FILES = [
    "*.json",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]


def context_length(model) -> int | None:
    """A loaded model's context length (its args' max_position_embeddings), None where it has none."""
    return getattr(getattr(model, "args", None), "max_position_embeddings", None)


def _local(folder: str) -> Path:
    path = Path(folder).expanduser()
    if path.exists():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(folder, allow_patterns=_TOKENIZER_FILES))


def _args_context(config: dict) -> int | None:
    """max_position_embeddings as the architecture's ModelArgs reads config.json (its default where
    the file has none); the file's own value where the architecture is not one mlx-lm knows."""
    model_type = config.get("model_type")
    architectures = config.get("architectures") or ()
    architectures = (architectures,) if isinstance(architectures, str) else architectures
    remapped = [MODEL_ARCHITECTURE_REMAPPING.get((model_type, a)) for a in architectures]
    model_type = next((r for r in remapped if r), None) or MODEL_REMAPPING.get(model_type, model_type)
    try:
        args = importlib.import_module(f"mlx_lm.models.{model_type}").ModelArgs.from_dict(config)
    except (ImportError, AttributeError, TypeError, ValueError):
        return config.get("max_position_embeddings")
    return getattr(args, "max_position_embeddings", None)


def read_tokenizer(model: str | None):
    """(tokenizer, context length or None) of a model name, as load_policy would give them, without
    loading the weights."""
    folder = model_folder(model)
    tokenizer_config = None
    if folder != resolve_model_path(model):  # converted from GGUF: as load_with_config reads its tokenizer
        from transformers import PretrainedConfig

        tokenizer_config = {"config": PretrainedConfig()}
    path = _local(str(folder))
    config = load_config(path)
    tokenizer = load_tokenizer(path, tokenizer_config, eos_token_ids=config.get("eos_token_id", None))
    return tokenizer, _args_context(config)
