"""Files written whole or not at all: a reader (or a crash) never sees half a file.

Each write goes to a temporary name beside its target, is flushed to disk,
then renamed into place (an atomic step on POSIX), and the folder's entry is
flushed too. Used by checkpoints (run/checkpoint.py) and by adapters saved
outside a run (models/adapters.py), so it sits below both.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import mlx.core as mx


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which and why."""


def os_reason(e: Exception) -> str:
    """The OS's words for a failed write (e.g. 'No space left on device'), else the message."""
    return getattr(e, "strerror", None) or str(e)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def file_sha256(path: Path) -> str:
    """The file's sha256, read in blocks (a checkpoint's weights can be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # a new run's folder is made by its first write
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        remove_quietly(tmp)
        raise CheckpointError(f"could not write {path}: {os_reason(e)}") from e
    fsync_dir(path.parent)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_save_safetensors(path: Path, arrays: dict) -> None:
    path = Path(path)
    # mx.save_safetensors appends ".safetensors" to names that lack it.
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.safetensors")
    try:
        mx.save_safetensors(str(tmp), arrays)  # MLX reports a failed write as RuntimeError
        fsync_file(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        remove_quietly(tmp)
        raise CheckpointError(f"could not write {path}: {os_reason(e)}") from e
    fsync_dir(path.parent)


def read_run_records(path: Path) -> list[dict]:
    """The records of a run's JSONL file (metrics, health events); empty when it is not there yet."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def training_rows(rows: list[dict]) -> list[dict]:
    """The rows of metrics.jsonl that are training steps: not the held-out evaluations written before
    training (step 0, `"before": true`) and at the end (`"final": true`)."""
    return [r for r in rows if "before" not in r and "final" not in r]
