"""What a model name says about the model before it is loaded: does it have a chat template?

A task talks to a chat model through its template, and to a base model (one
with no template, such as Gemma 3 270M's GGUF file) through a plain-text
frame instead (a task's `prompt_format`). Settings are chosen before the
slow model load, so the answer comes from the file's metadata alone.
"""

from __future__ import annotations

import json
from pathlib import Path

from .gguf_file import GGUFError, read_header


def has_chat_template(model: str | None) -> bool:
    """False when the model's files carry no chat template; True when they do or cannot be read here.

    Unknown (a Hugging Face id not downloaded, a file that does not read) counts
    as a chat model: that was the behaviour before base models were told apart,
    and the load itself reports a file that is broken.
    """
    from .loading import resolve_model_path

    try:
        path = Path(resolve_model_path(model)).expanduser()
    except (OSError, ValueError):
        return True
    if path.is_file():
        try:
            return bool(read_header(path).metadata.get("tokenizer.chat_template"))
        except GGUFError:
            return True
    if path.is_dir():
        if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
            return True
        try:
            config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return True
        return bool(config.get("chat_template"))
    return True
