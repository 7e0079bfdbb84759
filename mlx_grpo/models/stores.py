"""Models named by the app that downloaded them: the GGUF files in Ollama's and LM Studio's stores.

- `ollama:NAME[:TAG]` (TAG defaults to `latest`; NAME may be `NAMESPACE/NAME`
  or `HOST/NAMESPACE/NAME`): the store is `$OLLAMA_MODELS`, else
  `~/.ollama/models`. The manifest `manifests/<host>/<namespace>/<name>/<tag>`
  (host registry.ollama.ai and namespace library by default) lists the model's
  layers; the one of media type `application/vnd.ollama.image.model` is the
  GGUF file, stored as `blobs/sha256-<digest>`.
- `lmstudio:PUBLISHER/REPO[/FILE]`: the store is `$LMSTUDIO_MODELS`, else
  `~/.lmstudio/models`, else `~/.cache/lm-studio/models` (older versions).
  `PUBLISHER/REPO/` holds the model's .gguf files; FILE picks one when there
  are several (vision projectors, `mmproj-*.gguf`, are not models).

A name that is not there is one line that lists what is installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
_DEFAULT_HOST, _DEFAULT_NAMESPACE = "registry.ollama.ai", "library"


class StoreError(FileNotFoundError):
    """A store name that does not lead to a model file, said in one line."""


def is_store_name(name: str | None) -> bool:
    return isinstance(name, str) and name.startswith(("ollama:", "lmstudio:"))


def resolve_store_name(name: str) -> Path:
    """The GGUF file an `ollama:` or `lmstudio:` name stands for."""
    kind, _, rest = name.partition(":")
    if not rest:
        raise StoreError(
            f"model {name}: say which model, as ollama:NAME[:TAG] or lmstudio:PUBLISHER/REPO[/FILE]"
        )
    return ollama_model(rest) if kind == "ollama" else lmstudio_model(rest)


# ---------------------------------------------------------------------------
# Ollama


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def _ollama_parts(reference: str) -> tuple[str, str, str, str]:
    """(host, namespace, name, tag) of NAME[:TAG], NAMESPACE/NAME[:TAG] or HOST/NAMESPACE/NAME[:TAG]."""
    path, _, tag = reference.partition(":")
    parts = path.split("/")
    if len(parts) == 1:
        parts = [_DEFAULT_HOST, _DEFAULT_NAMESPACE, *parts]
    elif len(parts) == 2:
        parts = [_DEFAULT_HOST, *parts]
    if len(parts) != 3 or not all(parts):
        raise StoreError(
            f"model ollama:{reference}: not an Ollama name (NAME[:TAG], NAMESPACE/NAME[:TAG] or "
            "HOST/NAMESPACE/NAME[:TAG])"
        )
    return parts[0], parts[1], parts[2], tag or "latest"


def installed_ollama(root: Path | None = None) -> list[str]:
    """The names of the models in an Ollama store, as `ollama:` names."""
    manifests = (root or ollama_root()) / "manifests"
    names = []
    for manifest in sorted(manifests.glob("*/*/*/*")):
        if manifest.is_file():
            host, namespace, name, tag = manifest.relative_to(manifests).parts
            short = (
                name
                if (host, namespace) == (_DEFAULT_HOST, _DEFAULT_NAMESPACE)
                else (f"{namespace}/{name}" if host == _DEFAULT_HOST else f"{host}/{namespace}/{name}")
            )
            names.append(f"ollama:{short}:{tag}")
    return sorted(names)


def _installed_line(names: list[str]) -> str:
    if not names:
        return "none is installed"
    shown = ", ".join(names[:20])
    return f"installed: {shown}" + (f" and {len(names) - 20} more" if len(names) > 20 else "")


def ollama_model(reference: str) -> Path:
    root = ollama_root()
    host, namespace, name, tag = _ollama_parts(reference)
    if not (root / "manifests").is_dir():
        raise StoreError(
            f"model ollama:{reference}: no Ollama store at {root} (set OLLAMA_MODELS to the folder "
            "that holds manifests/ and blobs/)"
        )
    manifest = root / "manifests" / host / namespace / name / tag
    if not manifest.is_file():
        raise StoreError(
            f"model ollama:{reference} is not in the Ollama store at {root} "
            f"({_installed_line(installed_ollama(root))}); get it with: ollama pull {reference}"
        )
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (OSError, ValueError, AttributeError, KeyError, TypeError, StopIteration):
        raise StoreError(
            f"model ollama:{reference}: its manifest {manifest} names no model layer "
            f"({OLLAMA_MODEL_LAYER}); pull it again"
        ) from None
    blob = root / "blobs" / str(digest).replace(":", "-", 1)
    if not blob.is_file():
        raise StoreError(
            f"model ollama:{reference}: its manifest points at {blob}, which is missing; pull it again "
            f"with: ollama pull {reference}"
        )
    return blob


# ---------------------------------------------------------------------------
# LM Studio


def lmstudio_root() -> Path:
    if os.environ.get("LMSTUDIO_MODELS"):
        return Path(os.environ["LMSTUDIO_MODELS"]).expanduser()
    for candidate in (Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"):
        if candidate.is_dir():
            return candidate
    return Path.home() / ".lmstudio" / "models"


def _model_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.gguf") if p.is_file() and not p.name.lower().startswith("mmproj"))


def installed_lmstudio(root: Path | None = None) -> list[str]:
    root = root or lmstudio_root()
    return [
        f"lmstudio:{folder.relative_to(root).as_posix()}"
        for folder in sorted(root.glob("*/*"))
        if folder.is_dir() and _model_files(folder)
    ]


def lmstudio_model(reference: str) -> Path:
    root = lmstudio_root()
    parts = reference.strip("/").split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise StoreError(
            f"model lmstudio:{reference}: not an LM Studio name (PUBLISHER/REPO or PUBLISHER/REPO/FILE)"
        )
    if not root.is_dir():
        raise StoreError(
            f"model lmstudio:{reference}: no LM Studio models folder at {root} (set LMSTUDIO_MODELS to "
            "the folder that holds PUBLISHER/REPO/)"
        )
    folder = root / parts[0] / parts[1]
    files = _model_files(folder) if folder.is_dir() else []
    if not files:
        raise StoreError(
            f"model lmstudio:{reference} is not in the LM Studio folder {root} "
            f"({_installed_line(installed_lmstudio(root))})"
        )
    if len(parts) == 3:
        chosen = [f for f in files if f.name == parts[2] or f.stem == parts[2]]
        if not chosen:
            raise StoreError(
                f"model lmstudio:{reference}: {folder} has no file {parts[2]} "
                f"(it has {', '.join(f.name for f in files)})"
            )
        return chosen[0]
    if len(files) > 1:
        raise StoreError(
            f"model lmstudio:{reference}: {folder} holds {len(files)} model files; name one, e.g. "
            f"lmstudio:{parts[0]}/{parts[1]}/{files[0].name} (files: {', '.join(f.name for f in files)})"
        )
    return files[0]
