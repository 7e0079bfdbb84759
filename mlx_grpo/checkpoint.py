"""Atomic checkpoints and exact resume.

A run folder looks like:

    RUN_DIR/
      config.yaml                 the resolved configuration of the run
      adapters.safetensors        latest weights, mlx-lm's adapter format
      adapter_config.json         (so `--adapter-path RUN_DIR` just works)
      metrics.jsonl, completions.jsonl
      checkpoints/
        step_000050/              adapters + optimizer.safetensors + state.json
        latest                    name of the newest complete checkpoint

A checkpoint folder is written under a temporary name and renamed into place
only when every file in it is complete; `latest` is replaced atomically after
that. A crash at any moment leaves the previous checkpoint intact and
`latest` pointing at a complete folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

CHECKPOINTS = "checkpoints"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
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


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def atomic_save_safetensors(path: Path, arrays: dict) -> None:
    path = Path(path)
    # mx.save_safetensors appends ".safetensors" to names that lack it.
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.safetensors")
    mx.save_safetensors(str(tmp), arrays)
    _fsync_file(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def save_checkpoint(run_dir: Path, step: int, adapter_weights: dict, adapter_config: dict,
                    optimizer_state, state: dict, keep_last: int = 2) -> Path:
    """Write checkpoint `step` atomically and point `latest` at it.

    adapter_weights: flat {name: array} of the trained weights.
    optimizer_state: the optimizer's (nested) state tree.
    state: JSON-able trainer state (step, data position, random seeds, ...).
    """
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / _checkpoint_name(step)
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()

    mx.save_safetensors(str(tmp / "adapters.safetensors"), adapter_weights)
    flat_opt = dict(tree_flatten(optimizer_state))
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), flat_opt)
    state = dict(state, step=step)
    (tmp / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
    (tmp / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True))
    for f in tmp.iterdir():
        _fsync_file(f)
    _fsync_dir(tmp)

    if final.exists():  # a re-save of the same step (e.g. after resume)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    atomic_write_text(root / "latest", final.name + "\n")
    _prune(root, keep_last, keep=final.name)
    return final


def _prune(root: Path, keep_last: int, keep: str) -> None:
    complete = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in complete[:-keep_last] if keep_last > 0 else []:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".step_*.tmp-*"):  # left behind by a killed writer
        shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / "latest"
    if not pointer.exists():
        return None
    folder = root / pointer.read_text().strip()
    return folder if (folder / "state.json").exists() else None


def load_checkpoint(folder: Path):
    """Returns (adapter_weights, optimizer_state_tree, state)."""
    folder = Path(folder)
    try:
        state = json.loads((folder / "state.json").read_text())
        weights = mx.load(str(folder / "adapters.safetensors"))
        opt_flat = mx.load(str(folder / "optimizer.safetensors"))
    except (OSError, ValueError, RuntimeError) as e:
        raise RuntimeError(f"checkpoint {folder} is unreadable or corrupt: {e}") from e
    return weights, tree_unflatten(list(opt_flat.items())), state

