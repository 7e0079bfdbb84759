"""GGUF tensor blocks decoded in NumPy: kept quantized where MLX's layout holds them exactly, else widened.

MLX's affine quantization stores w = scale * q + bias, with one scale and
one bias per group of consecutive elements of a row and the integers q packed
as a little-endian bit stream into uint32 words. Many llama.cpp block types
are exactly that with groups of 32:

  type   block  per group of 32            as MLX
  Q4_0   32     x = d * (q - 8)            4 bits, scale d, bias -8d
  Q4_1   32     x = d * q + m              4 bits, scale d, bias m
  Q5_0   32     x = d * (q - 16)           5 bits, scale d, bias -16d
  Q5_1   32     x = d * q + m              5 bits, scale d, bias m
  Q8_0   32     x = d * q  (q signed)      8 bits, q + 128, scale d, bias -128d
  Q4_K   256    x = d*sc * q - dmin*m      4 bits, scale d*sc, bias -dmin*m (8 sub-blocks)
  Q5_K   256    x = d*sc * q - dmin*m      5 bits, likewise

The K types' scales are 6-bit integers times a float16 super-scale; their
products need up to 17 significant bits, so they are kept in float32 unless
every one of a tensor's scales and biases is exact in float16.

Q2_K, Q3_K and Q6_K scale sub-blocks of 16 elements, which no group of 32
can hold: they are widened to float, float16 when every value of the tensor
is exactly a float16, else float32. Nothing is ever re-quantized.

Block layouts follow ggml's (ggml-common.h); tests check every type
against the `gguf` package's NumPy dequantizers, an independent oracle.
"""

from __future__ import annotations

import numpy as np

# ggml type id -> (name, elements per block, bytes per block): every type read here
TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    30: ("BF16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
}
GROUP_SIZE = 32


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block, as float32 (n, 1)."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes a block -> 32 values: the low nibbles are elements 0-15, the high ones 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Bit j of each block's little-endian bit field, for j < count, as 0/1 (n, count)."""
    return np.unpackbits(qh, axis=-1, bitorder="little")[:, :count]


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: the 8 six-bit scales and 8 six-bit mins packed in 12 bytes a block."""
    p = packed.astype(np.uint8)
    scales = np.empty((p.shape[0], 8), np.uint8)
    mins = np.empty((p.shape[0], 8), np.uint8)
    scales[:, :4], mins[:, :4] = p[:, 0:4] & 63, p[:, 4:8] & 63
    scales[:, 4:] = (p[:, 8:12] & 0x0F) | ((p[:, 0:4] >> 6) << 4)
    mins[:, 4:] = (p[:, 8:12] >> 4) | ((p[:, 4:8] >> 6) << 4)
    return scales, mins


def _k_levels(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K low nibbles: each 32 bytes hold elements j..j+31 (low) and j+32..j+63 (high)."""
    chunks = qs.reshape(-1, 4, 32)
    return np.stack([chunks & 0x0F, chunks >> 4], axis=2).reshape(-1, 256)


# ---- affine types: (levels (n, block) uint8, scales (n, block/32), biases (n, block/32)) in float32


def _q4_0(b):
    d = _f16(b, 0)
    return _nibbles(b[:, 2:18]), d, -8 * d


def _q4_1(b):
    return _nibbles(b[:, 4:20]), _f16(b, 0), _f16(b, 2)


def _q5_0(b):
    d = _f16(b, 0)
    return _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6], 32) << 4), d, -16 * d


def _q5_1(b):
    return _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8], 32) << 4), _f16(b, 0), _f16(b, 2)


def _q8_0(b):
    d = _f16(b, 0)
    return (b[:, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d, -128 * d


def _q4_k(b):
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, m = _k_scales(b[:, 4:16])
    return _k_levels(b[:, 16:144]), d * sc, -(dmin * m)


def _q5_k(b):
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, m = _k_scales(b[:, 4:16])
    # Element e of the block takes its fifth bit from bit e // 32 of qh[e % 32].
    high = np.unpackbits(b[:, 16:48], axis=-1, bitorder="little").reshape(-1, 32, 8).transpose(0, 2, 1)
    return _k_levels(b[:, 48:176]) | (high.reshape(-1, 256) << 4), d * sc, -(dmin * m)


AFFINE = {
    2: (4, _q4_0),
    3: (4, _q4_1),
    6: (5, _q5_0),
    7: (5, _q5_1),
    8: (8, _q8_0),
    12: (4, _q4_k),
    13: (5, _q5_k),
}


# ---- widened types: float32 values (n, 256)


def _q2_k(b):
    scales, qs = b[:, 0:16], b[:, 16:80]
    d, dmin = _f16(b, 80), _f16(b, 82)
    # Each half of 128 elements reads 32 bytes at four shifts; each shift gives 2 x 16 elements.
    q = np.stack([(qs.reshape(-1, 2, 1, 32) >> s) & 3 for s in (0, 2, 4, 6)], axis=2).reshape(-1, 16, 16)
    return ((d * (scales & 0x0F))[..., None] * q - (dmin * (scales >> 4))[..., None]).reshape(-1, 256)


def _q3_k(b):
    hmask, qs, packed = b[:, 0:32], b[:, 32:96], b[:, 96:108].astype(np.uint32)
    d = _f16(b, 108)
    # The 16 six-bit scales: low 4 bits from bytes 0-7, high 2 bits from bytes 8-11.
    low = np.concatenate([packed[:, 0:8] & 0x0F, packed[:, 0:8] >> 4], axis=1)
    high = np.concatenate([(packed[:, 8:12] >> s) & 3 for s in (0, 2, 4, 6)], axis=1)
    scales = (low | (high << 4)).astype(np.float32) - 32
    q = np.stack([(qs.reshape(-1, 2, 1, 32) >> s) & 3 for s in (0, 2, 4, 6)], axis=2).reshape(-1, 256)
    hm = (
        np.unpackbits(hmask, axis=-1, bitorder="little")
        .reshape(-1, 32, 8)
        .transpose(0, 2, 1)
        .reshape(-1, 256)
    )
    values = q.astype(np.float32) - np.where(hm, 0, 4).astype(np.float32)
    return ((d * scales)[..., None] * values.reshape(-1, 16, 16)).reshape(-1, 256)


def _q6_k(b):
    ql, qh, scales = b[:, 0:128], b[:, 128:192], b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b, 208)
    ql, qh = ql.reshape(-1, 2, 64), qh.reshape(-1, 2, 32)
    parts = [
        (ql[..., :32] & 0x0F) | (((qh >> 0) & 3) << 4),
        (ql[..., 32:] & 0x0F) | (((qh >> 2) & 3) << 4),
        (ql[..., :32] >> 4) | (((qh >> 4) & 3) << 4),
        (ql[..., 32:] >> 4) | (((qh >> 6) & 3) << 4),
    ]
    q = np.stack(parts, axis=2).reshape(-1, 16, 16).astype(np.float32) - 32
    return ((d * scales)[..., None] * q).reshape(-1, 256)


WIDENED = {10: _q2_k, 11: _q3_k, 14: _q6_k}


def pack(levels: np.ndarray, bits: int) -> np.ndarray:
    """(rows, n) integers below 2**bits -> MLX's packed uint32 words (rows, n * bits / 32)."""
    rows = levels.shape[0]
    stream = np.unpackbits(levels.astype(np.uint8)[..., None], axis=-1, bitorder="little")[..., :bits]
    return np.packbits(stream.reshape(rows, -1), axis=-1, bitorder="little").view(np.uint32)


def _exact_f16(*arrays: np.ndarray) -> bool:
    return all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in arrays)


def decode(raw: np.ndarray, type_id: int, shape: tuple[int, ...]):
    """One tensor's bytes as ("float", values) or ("affine", (packed, scales, biases, bits)).

    `shape` is in NumPy order (rows first); a row's length must be whole blocks.
    """
    name, block, size = TYPES[type_id]
    if type_id in (0, 1):
        return "float", raw.view(np.float32 if type_id == 0 else np.float16).reshape(shape)
    if type_id == 30:  # bfloat16: the high half of a float32
        return "float", (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    blocks = raw.reshape(-1, size)
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if type_id in WIDENED:
        values = WIDENED[type_id](blocks).reshape(shape)
        return "float", values.astype(np.float16) if _exact_f16(values) else values
    bits, decoder = AFFINE[type_id]
    levels, scales, biases = decoder(blocks)
    scales = np.broadcast_to(scales, (blocks.shape[0], block // GROUP_SIZE)).reshape(rows, -1)
    biases = np.broadcast_to(biases, (blocks.shape[0], block // GROUP_SIZE)).reshape(rows, -1)
    if _exact_f16(scales, biases):
        scales, biases = scales.astype(np.float16), biases.astype(np.float16)
    packed = pack(levels.reshape(rows, -1), bits).reshape(*shape[:-1], -1)
    return "affine", (packed, scales.reshape(*shape[:-1], -1), biases.reshape(*shape[:-1], -1), bits)


def dequantize(raw: np.ndarray, type_id: int, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of one tensor's bytes, whatever its type."""
    kind, value = decode(raw, type_id, shape)
    if kind == "float":
        return np.asarray(value, dtype=np.float32)
    packed, scales, biases, bits = value
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    stream = np.unpackbits(packed.reshape(rows, -1).view(np.uint8), axis=-1, bitorder="little")
    levels = np.packbits(stream.reshape(rows, -1, bits), axis=-1, bitorder="little")
    levels = levels.reshape(rows, -1, GROUP_SIZE).astype(np.float32)
    out = scales.reshape(rows, -1, 1).astype(np.float32) * levels + biases.reshape(rows, -1, 1).astype(
        np.float32
    )
    return out.reshape(shape)
