"""Reading a GGUF file's header: its metadata and where each tensor lies.

GGUF (llama.cpp's format) is a header of typed key/value metadata and tensor
descriptions, followed by the tensor data. The header is parsed here, by
hand, because what can go wrong with a file a user names (not a GGUF file, a
download cut short, a tensor type MLX cannot read) must come back as one
sentence that says which; gguf_quants.py decodes the tensors' blocks.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .gguf_quants import TYPES

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# ggml tensor types read (gguf_quants.py): id -> (name, elements per block, bytes per block).
# Names of the types that are not read are kept for the error message.
TENSOR_TYPES = TYPES
OTHER_TENSOR_TYPES = {
    9: "Q8_1",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
}

# Metadata value types: id -> struct format of a scalar (strings and arrays apart).
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A GGUF file that cannot be used, said in one line."""


@dataclass
class TensorInfo:
    name: str
    type_id: int
    shape: tuple[int, ...]  # in MLX / NumPy order (GGUF lists the fastest-moving dimension first)
    offset: int  # from the start of the file

    @property
    def type_name(self) -> str:
        if self.type_id in TENSOR_TYPES:
            return TENSOR_TYPES[self.type_id][0]
        return OTHER_TENSOR_TYPES.get(self.type_id, f"type {self.type_id}")

    @property
    def nbytes(self) -> int:
        _, block, size = TENSOR_TYPES[self.type_id]
        return int(np.prod(self.shape, dtype=np.int64)) // block * size


@dataclass
class GGUFHeader:
    version: int
    metadata: dict
    tensors: list[TensorInfo]
    file_size: int


class _Cursor:
    """Reads little-endian values from a buffer; running past its end means a truncated file."""

    def __init__(self, buffer, path: Path):
        self.buffer, self.path, self.pos = buffer, path, 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buffer):
            raise GGUFError(f"{self.path}: the file ends inside its header (truncated or corrupt GGUF file)")
        view = memoryview(self.buffer)[self.pos : self.pos + n]
        self.pos += n
        return view

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        raw = bytes(self.take(self.scalar("<Q")))
        return raw.decode("utf-8", errors="replace")

    def value(self, type_id: int):
        if type_id in _SCALARS:
            return self.scalar(_SCALARS[type_id])
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            item_type, count = self.scalar("<I"), self.scalar("<Q")
            if item_type in _SCALARS and item_type != 7:  # numbers: one NumPy view instead of a loop
                dtype = np.dtype(_SCALARS[item_type])
                return np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype).tolist()
            return [self.value(item_type) for _ in range(count)]
        raise GGUFError(f"{self.path}: unknown metadata value type {type_id} (corrupt GGUF file?)")


def read_header(path: str | Path) -> GGUFHeader:
    """The metadata and tensor table of a GGUF file, checked against the file's length."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise GGUFError(f"{path}: not a GGUF file ({size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
                return _parse(_Cursor(buffer, path), size)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read ({e.strerror or e})") from None


def _parse(cursor: _Cursor, size: int) -> GGUFHeader:
    path = cursor.path
    if bytes(cursor.take(4)) != MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    version = cursor.scalar("<I")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    tensor_count, kv_count = cursor.scalar("<Q"), cursor.scalar("<Q")
    if tensor_count > size or kv_count > size:
        raise GGUFError(f"{path}: corrupt GGUF header ({tensor_count} tensors, {kv_count} keys)")
    metadata = {}
    for _ in range(kv_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.scalar("<I"))
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = [cursor.scalar("<Q") for _ in range(cursor.scalar("<I"))]
        infos.append((name, tuple(reversed(dims)), cursor.scalar("<I"), cursor.scalar("<Q")))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = [
        TensorInfo(name, type_id, shape, data_start + offset) for name, shape, type_id, offset in infos
    ]
    for t in tensors:
        if t.type_id in TENSOR_TYPES and t.offset + t.nbytes > size:
            raise GGUFError(
                f"{path}: tensor {t.name} ends past the end of the file "
                f"({size} bytes): the file is truncated (an incomplete download?)"
            )
    return GGUFHeader(version, metadata, tensors, size)


def tensor_bytes(path: str | Path, t: TensorInfo) -> np.ndarray:
    """The raw bytes of one tensor (a read-only view of the file)."""
    return np.memmap(path, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,))
