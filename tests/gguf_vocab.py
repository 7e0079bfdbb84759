"""Vocabulary-only GGUF files and llama.cpp's own detokenizer, for the tokenizer tests.

llama.cpp reads a file's vocabulary without its tensors (`vocab_only=True`),
so a tokenizer test needs only the architecture's few required keys and the
tokenizer.* metadata, written exactly as given (a key left out is left out,
so llama.cpp's defaults can be tested too).
"""

from __future__ import annotations

import ctypes
from pathlib import Path


def write_vocab_file(path: Path, metadata: dict, name: str | None = None) -> Path:
    """A GGUF file (architecture llama, no tensors) holding `metadata`'s keys; general.name if given."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (
        ("context_length", 512),
        ("embedding_length", 64),
        ("block_count", 1),
        ("feed_forward_length", 128),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 4),
    ):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    if name:
        writer.add_name(name)
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, list(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_cpp_vocab(path: Path):
    import llama_cpp

    return llama_cpp.Llama(str(path), vocab_only=True, verbose=False)


def llama_cpp_detokenize(llama, ids: list[int]) -> str:
    """llama.cpp's llama_detokenize (control tokens written out): its leading-space and clean-up rules.
    (llama-cpp-python's Llama.detokenize joins the tokens' pieces instead.)"""
    import llama_cpp

    size = 64 + 64 * len(ids)
    text = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(
        llama._model.vocab,
        (llama_cpp.llama_token * max(len(ids), 1))(*ids),
        len(ids),
        text,
        size,
        False,
        True,
    )
    assert n >= 0
    return text.raw[:n].decode("utf-8", errors="replace")
