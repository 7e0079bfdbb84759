"""`mlx-grpo export`: a trained model, fused, as a GGUF file or an MLX folder.

The base model and its adapters become one model with plain weights. A
quantized base is first widened to float32 (exactly: the 4- or 8-bit values
times their scales plus their biases), the adapters are added in float32,
and only then is the result written at the chosen type. So the adapters are
not rounded through the base's quantization grid and back.

The GGUF file is what llama.cpp's own converter writes for a Hugging Face
llama, mistral, qwen2, qwen3, gemma3 (text) or phi3 model: its tensor names
and stored conventions (gguf_arch.py: llama's Q/K row order, gemma's norms
plus one), the architecture metadata, and the tokenizer with its chat
template (copied from the base's GGUF file, or rebuilt from a folder model's
tokenizer). f16 by
default; q8_0 and q4_0 are quantized with the `gguf` package's own NumPy
quantizers (blocks of 32 along each row), which is what llama.cpp reads.
The K-quant mixes that Ollama and LM Studio users hold (q4_k_m, q5_k_m, q6_k)
come from llama.cpp's own quantizer (llama-cpp-python's
llama_model_quantize), run on the f16 file: its per-tensor choices (which
tensors get 6 bits, where rows do not divide by 256) are llama.cpp's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from . import gguf_arch
from .gguf_file import read_header
from .gguf_tokenizer import metadata_from_hf

# llama.cpp's general.file_type of each output type (its LlamaFileType, llama_ftype).
_FILE_TYPES = {"f16": 1, "q8_0": 7, "q4_0": 2}
K_QUANT_TYPES = {"q4_k_m": 15, "q5_k_m": 17, "q6_k": 18}  # quantized by llama.cpp itself
OUTTYPES = (*_FILE_TYPES, *K_QUANT_TYPES)


class ExportError(ValueError):
    """Something that stops an export (a bad source, an existing output, an unsupported model); one line."""


# ---------------------------------------------------------------------------
# Fusing


def _widened(module: nn.Module) -> nn.Module:
    """A float32 copy of a quantized linear or embedding (q * scale + bias, computed in float32)."""
    weight = mx.dequantize(
        module.weight,
        module.scales.astype(mx.float32),
        module.biases.astype(mx.float32),
        group_size=module.group_size,
        bits=module.bits,
        mode=module.mode,
    )
    if isinstance(module, nn.QuantizedEmbedding):
        plain = nn.Embedding(*weight.shape)
    else:
        plain = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in module)
        if "bias" in module:
            plain.bias = module.bias
    plain.weight = weight
    return plain


def fuse_in_float32(model: nn.Module) -> nn.Module:
    """Widen every quantized layer and every weight to float32, then fold each adapter into its layer."""
    quantized = [
        (name, _widened(m))
        for name, m in model.named_modules()
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    ]
    if quantized:
        model.update_modules(tree_unflatten(quantized))
    model.set_dtype(mx.float32)
    adapters = [(name, m.fuse()) for name, m in model.named_modules() if hasattr(m, "fuse")]
    if adapters:
        model.update_modules(tree_unflatten(adapters))
    return model


def load_fused(base: str | None, adapter: str | None):
    """(fused float32 model, tokenizer, config.json dict, the base's resolved path) of a base and its
    adapters."""
    from .loading import load_with_config, resolve_model_path

    model, tokenizer, config = load_with_config(base, adapter)
    fuse_in_float32(model)
    mx.eval(model.parameters())
    config = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
    return model, tokenizer, config, resolve_model_path(base)


# ---------------------------------------------------------------------------
# Writing


def _check_output(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise ExportError(f"{path} exists; choose another name or pass --force to overwrite it")


def write_mlx(model: nn.Module, tokenizer, config: dict, folder: Path, force: bool = False) -> Path:
    """An mlx-lm folder of the fused model (float32 weights)."""
    folder = Path(folder)
    _check_output(folder, force)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    weights = dict(tree_flatten(model.parameters()))
    if config.get("tie_word_embeddings", True):
        weights.pop("lm_head.weight", None)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    getattr(tokenizer, "_tokenizer", tokenizer).save_pretrained(str(folder))
    return folder


def gguf_tensor_name(name: str, arch: str = "llama") -> str:
    """`model.layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`."""
    return gguf_arch.gguf_name(name, arch)


def model_settings(model: nn.Module, config: dict) -> dict:
    """config.json with the defaults mlx-lm's model filled in (what the model computes, e.g. gemma3's
    window)."""
    args = getattr(model, "args", None)
    return {**config, **dataclasses.asdict(args)} if dataclasses.is_dataclass(args) else dict(config)


def gguf_tensors(model: nn.Module, config: dict) -> dict[str, np.ndarray]:
    """float32 NumPy tensors under llama.cpp's names and in its conventions (gguf_arch.to_gguf)."""
    out = {}
    for name, w in tree_flatten(model.parameters()):
        if name == "lm_head.weight" and config.get("tie_word_embeddings", True):
            continue
        gguf_name, w = gguf_arch.to_gguf(name, w.astype(mx.float32), config)
        out[gguf_name] = np.array(w)
    return out


def _tokenizer_metadata(writer, meta: dict) -> None:
    writer.add_tokenizer_model(meta["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    if not meta[
        "tokenizer.ggml.merges"
    ]:  # llama.cpp requires the list, and gguf's writer cannot write it empty
        raise ExportError("the tokenizer has no BPE merges; GGUF cannot carry it")
    writer.add_token_merges(meta["tokenizer.ggml.merges"])
    if "tokenizer.ggml.scores" in meta:
        writer.add_token_scores(meta["tokenizer.ggml.scores"])
    for key, add in (
        ("bos", writer.add_bos_token_id),
        ("eos", writer.add_eos_token_id),
        ("padding", writer.add_pad_token_id),
        ("unknown", writer.add_unk_token_id),
    ):
        if f"tokenizer.ggml.{key}_token_id" in meta:
            add(int(meta[f"tokenizer.ggml.{key}_token_id"]))
    for key, add in (
        ("add_bos_token", writer.add_add_bos_token),
        ("add_eos_token", writer.add_add_eos_token),
    ):
        if f"tokenizer.ggml.{key}" in meta:
            add(bool(meta[f"tokenizer.ggml.{key}"]))
    if meta.get("tokenizer.chat_template"):
        writer.add_chat_template(meta["tokenizer.chat_template"])


@contextlib.contextmanager
def _c_output_to(sink):
    """Send what C code writes to stdout and stderr into `sink` (a file) for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        yield sink
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def _last_line(log) -> str:
    log.seek(0)
    lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def _llama_cpp_quantizer():
    try:
        import llama_cpp
    except ImportError:
        raise ExportError(
            "--outtype q4_k_m, q5_k_m and q6_k use llama.cpp's own quantizer, from "
            'llama-cpp-python: pip install -e ".[llamacpp]" (or pip install llama-cpp-python)'
        ) from None
    return llama_cpp


def write_gguf(
    model: nn.Module,
    tokenizer,
    config: dict,
    base_path: str,
    path: Path,
    outtype: str = "f16",
    force: bool = False,
    name: str | None = None,
) -> Path:
    """A GGUF file of the fused model; the tokenizer comes from the base's GGUF file when it has one."""
    if outtype not in OUTTYPES:
        raise ExportError(f"--outtype {outtype}: not one of {', '.join(OUTTYPES)}")
    if outtype in K_QUANT_TYPES:
        llama_cpp = _llama_cpp_quantizer()  # before anything is written
        path = Path(path)
        _check_output(path, force)
        full = path.with_name(f".{path.name}.f16.partial")
        partial = path.with_name(f".{path.name}.partial")
        try:
            write_gguf(model, tokenizer, config, base_path, full, "f16", True, name or path.stem)
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = K_QUANT_TYPES[outtype]
            with _c_output_to(tempfile.TemporaryFile()) as log:  # a line per tensor: kept unless it fails
                failed = (
                    llama_cpp.llama_model_quantize(str(full).encode(), str(partial).encode(), params) != 0
                )
            if failed:
                raise ExportError(f"llama.cpp could not quantize the model to {outtype}: {_last_line(log)}")
            partial.replace(path)  # a reader never sees half a file
        finally:
            full.unlink(missing_ok=True)
            partial.unlink(missing_ok=True)
        return path
    try:
        import gguf
    except ImportError:
        raise ExportError('writing GGUF needs the gguf package: pip install -e ".[gguf]"') from None
    config = model_settings(model, config)
    arch = gguf_arch.check_exportable(config).name  # before anything is written
    path = Path(path)
    _check_output(path, force)
    if Path(base_path).expanduser().is_file():  # a GGUF base: its own tokenizer metadata, verbatim
        meta = {k: v for k, v in read_header(base_path).metadata.items() if k.startswith("tokenizer.")}
    else:
        meta = metadata_from_hf(tokenizer, config["vocab_size"])
    qtype = {
        "f16": gguf.GGMLQuantizationType.F16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
        "q4_0": gguf.GGMLQuantizationType.Q4_0,
    }[outtype]
    partial = path.with_name(f".{path.name}.partial")
    writer = gguf.GGUFWriter(str(partial), arch)
    writer.add_name(name or path.stem)
    writer.add_file_type(_FILE_TYPES[outtype])
    if outtype != "f16":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    gguf_arch.write_metadata(writer, config)
    _tokenizer_metadata(writer, meta)
    for tensor_name, w in gguf_tensors(model, config).items():
        if w.ndim == 1:  # norms and biases stay float32, as llama.cpp keeps them
            writer.add_tensor(tensor_name, w)
        elif qtype == gguf.GGMLQuantizationType.F16 or w.shape[-1] % 32:  # rows not in whole blocks: f16
            writer.add_tensor(tensor_name, w.astype(np.float16))
        else:
            writer.add_tensor(tensor_name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    partial.replace(path)  # a reader never sees half a file
    return path


def export(
    base: str | None,
    adapter: str | None,
    gguf_path: str | None = None,
    mlx_path: str | None = None,
    outtype: str = "f16",
    force: bool = False,
) -> list[Path]:
    """Fuse `adapter` into `base` and write it where asked; returns the paths written."""
    if not gguf_path and not mlx_path:
        raise ExportError("say where to write: --gguf OUT.gguf and/or --mlx DIR")
    if outtype not in OUTTYPES:
        raise ExportError(f"--outtype {outtype}: not one of {', '.join(OUTTYPES)}")
    for target in (gguf_path, mlx_path):
        if target:
            _check_output(Path(target), force)
    model, tokenizer, config, base_path = load_fused(base, adapter)
    written = []
    if gguf_path:
        written.append(write_gguf(model, tokenizer, config, base_path, Path(gguf_path), outtype, force))
    if mlx_path:
        written.append(write_mlx(model, tokenizer, config, Path(mlx_path), force))
    return written
