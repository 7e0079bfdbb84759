"""GGUF files (llama.cpp, Ollama, LM Studio) as a model source.

A GGUF file is converted once into an ordinary mlx-lm model folder
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json),
cached under ~/.cache/mlx-grpo/gguf/ by the file's path, size and
modification time; after that it loads like any other mlx-lm model, and
adapters load on top with mlx-lm's own code.

Tensors are read block by block in NumPy (gguf_quants.py): the types that
MLX's affine layout holds exactly stay quantized (Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q4_K, Q5_K), the others that llama.cpp's presets write are widened
exactly to float (Q2_K, Q3_K, Q6_K; F16, BF16, F32 as they are), and the
rest (IQ types and others) are refused by name. How each type was carried is
written beside the model (gguf_types.json) and said when it loads.

Architectures: llama (Mistral's files included), qwen2, qwen3, gemma3 and phi3.
Tensor names follow each architecture's table in gguf_arch.py, and what
llama.cpp stores differently from Hugging Face (llama's permuted query and key
rows, gemma's norms plus one) is undone there, so the folder is a plain
HF-layout model and adapters trained on it suit the original model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import mlx.core as mx

from .gguf_arch import (
    hf_weights,  # noqa: F401 (public here too)
    model_config,
)
from .gguf_file import TENSOR_TYPES, GGUFError, GGUFHeader, read_header, tensor_bytes
from .gguf_quants import decode
from .gguf_tokenizer import write_tokenizer

__all__ = ["GGUFError", "converted_folder", "is_gguf", "types_note"]

GROUP_SIZE = 32  # every GGUF quantization kept as MLX's is in groups of 32
# Changing how files are converted must not reuse folders converted the old way.
CONVERTER_VERSION = 3  # 3: llama.cpp's token rules for both tokenizer kinds (gguf_tokenizer.py)
TYPES_FILE = "gguf_types.json"


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf") and Path(path).expanduser().is_file()


# ---------------------------------------------------------------------------
# Names, config and weights: models/gguf_arch.py (shared with export)


def check_tensor_types(header: GGUFHeader) -> None:
    for t in header.tensors:
        if t.type_id not in TENSOR_TYPES:
            readable = ", ".join(name for name, _, _ in TENSOR_TYPES.values())
            raise GGUFError(
                f"GGUF tensor {t.name} has type {t.type_name}, which mlx-grpo does not read "
                f"(readable: {readable}); use a file quantized with one of those (Q4_K_M is)"
            )
        block = TENSOR_TYPES[t.type_id][1]
        if not t.shape or t.shape[-1] % block:
            raise GGUFError(
                f"GGUF tensor {t.name} has rows of {t.shape[-1] if t.shape else 0} values, not whole "
                f"{t.type_name} blocks of {block} (corrupt GGUF file?)"
            )


def read_tensors(path: str | Path, header: GGUFHeader) -> tuple[dict[str, mx.array], dict[str, str]]:
    """Every tensor of the file, as MLX arrays (a quantized one as .weight/.scales/.biases), and how
    each was carried ("kept 4-bit (exact)", "float16 (exact)", ...) by tensor name."""
    arrays, carried = {}, {}
    for t in header.tensors:
        raw = tensor_bytes(path, t)
        kind, value = decode(raw, t.type_id, t.shape)
        stem = t.name[: -len(".weight")] if t.name.endswith(".weight") else t.name
        if kind == "affine":
            packed, scales, biases, bits = value
            arrays.update(
                {
                    f"{stem}.weight": mx.array(packed),
                    f"{stem}.scales": mx.array(scales),
                    f"{stem}.biases": mx.array(biases),
                }
            )
            carried[t.name] = f"kept {bits}-bit (exact)"
        else:
            arrays[t.name] = mx.array(value)
            widened = t.type_name not in ("F32", "F16")
            carried[t.name] = f"{'float16' if value.dtype == 'float16' else 'float32'}" + (
                " (exact)" if widened else ""
            )
        mx.eval(arrays[f"{stem}.weight" if kind == "affine" else t.name])  # one tensor's NumPy at a time
    return arrays, carried


def types_summary(header: GGUFHeader, carried: dict[str, str]) -> str:
    """One line: how each tensor type of the file was carried, e.g. "Q4_K x12: kept 4-bit (exact); ..."."""
    counts = Counter((t.type_name, carried[t.name]) for t in header.tensors)
    order = sorted(counts, key=lambda k: (-counts[k], k))
    return "; ".join(f"{name} x{counts[(name, how)]}: {how}" for name, how in order)


def types_note(folder: str | Path) -> str | None:
    """The summary line written beside a converted model, or None (not converted from GGUF)."""
    path = Path(folder) / TYPES_FILE
    try:
        return "GGUF tensors: " + json.loads(path.read_text(encoding="utf-8"))["summary"]
    except (OSError, ValueError, KeyError):
        return None


def quantization_config(weights: dict[str, mx.array]) -> dict | None:
    """mlx-lm's "quantization" entry: the most common bit width, and each module that differs."""
    bits = {
        name[: -len(".scales")]: weights[name[: -len(".scales")] + ".weight"].shape[-1]
        * 32
        // (weights[name].shape[-1] * GROUP_SIZE)
        for name in weights
        if name.endswith(".scales")
    }
    if not bits:
        return None
    common = Counter(bits.values()).most_common(1)[0][0]
    config = {"group_size": GROUP_SIZE, "bits": common}
    config.update(
        {module: {"group_size": GROUP_SIZE, "bits": b} for module, b in bits.items() if b != common}
    )
    return config


def convert(path: str | Path, folder: Path) -> None:
    """Write the mlx-lm folder of a GGUF file."""
    header = read_header(path)
    config = model_config(header)
    check_tensor_types(header)
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(header.metadata, folder, config["max_position_embeddings"])  # before the slow tensor read
    arrays, carried = read_tensors(path, header)
    weights = hf_weights(arrays, config)
    quantization = quantization_config(weights)
    if quantization:
        config["quantization"] = quantization
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / TYPES_FILE).write_text(
        json.dumps({"summary": types_summary(header, carried), "tensors": carried}, indent=1),
        encoding="utf-8",
    )
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


# ---------------------------------------------------------------------------
# The cache of converted folders


def cache_root() -> Path:
    return Path(os.environ.get("MLX_GRPO_CACHE") or Path.home() / ".cache" / "mlx-grpo")


def converted_folder(path: str | Path) -> Path:
    """The mlx-lm folder of a GGUF file: converted on first use, then reused while the file is unchanged."""
    source = Path(path).expanduser().resolve()
    stat = source.stat()
    key = f"{source}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERTER_VERSION}"
    folder = cache_root() / "gguf" / f"{source.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if (folder / "config.json").is_file():
        return folder
    # Written beside its final name and renamed: a reader never sees half a folder,
    # and two processes converting the same file at once both end with a whole one.
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        try:
            partial.mkdir(parents=True)
        except OSError as e:
            raise GGUFError(
                f"cannot write the converted model under {cache_root()} ({e.strerror or e}); "
                "set MLX_GRPO_CACHE to a writable folder"
            ) from None
        convert(source, partial)
        (partial / "source.json").write_text(
            json.dumps({"gguf": str(source), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}),
            encoding="utf-8",
        )
        try:
            partial.rename(folder)
        except OSError:
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder
