"""A very small random Qwen2 model with a byte-level tokenizer, for tests.

Independent of the embedded model, so the engine's tests don't depend on how
that model was trained, and gradients can be checked on a model small enough
for finite differences. It is scripts/bench.py's random model at 259 tokens:
the three special tokens and one per byte, so encoding uses no merges and text
round-trips (transformers loads a model_type "qwen2" tokenizer with Qwen's
byte-level pipeline).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench", Path(__file__).resolve().parents[1] / "scripts" / "bench.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)

BYTE_VOCAB = len(_bench.SPECIALS) + 256


def build_tiny_model(folder: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    return _bench.build_random_model(Path(folder), hidden=hidden, layers=layers, heads=4, kv_heads=2,
                                     intermediate=hidden * 2, vocab=BYTE_VOCAB, seed=seed)
