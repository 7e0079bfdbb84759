"""Atomic checkpoints and exact resume.

A run folder looks like:

    RUN_DIR/
      config.yaml                 the resolved configuration of the run
      adapters.safetensors        latest weights, mlx-lm's adapter format
      adapter_config.json         (so `--adapter-path RUN_DIR` just works)
      metrics.jsonl, completions.jsonl
      checkpoints/
        step_000050/              adapters + optimizer.safetensors + state.json + manifest.json
        latest                    name of the newest complete checkpoint
        best                      with keep_best: the checkpoint with the best eval accuracy

A checkpoint folder is written under a temporary name; its last file is
manifest.json (the size and sha256 of every other file), and only then is the
folder renamed into place and `latest` replaced. A crash at any moment leaves
the previous checkpoint intact. On resume every file is checked against the
manifest; a damaged newest checkpoint is passed over, with a warning, for the
newest intact one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..files import (
    CheckpointError,
    atomic_write_text,
    file_sha256,
    fsync_dir,
    fsync_file,
    os_reason,
    remove_quietly,
)
from ..files import (  # noqa: F401 (run/ and tests write through the checkpoint module: ckpt.atomic_write_json)
    atomic_save_safetensors,
    atomic_write_json,
)

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"


def ensure_writable(run_dir: Path) -> None:
    """Prove a file can be written in the run folder, before any work is done.

    Folders made for the proof are removed again (the first real write makes
    them), so a run that fails to start (a model that cannot load) leaves no
    empty run folder behind. Temporary files a killed run left behind
    (".NAME.tmp-PID") are removed.
    """
    run_dir = Path(run_dir)
    made = [folder for folder in (run_dir, *run_dir.parents) if not folder.exists()]  # deepest first
    probe = run_dir / f".write-test-{os.getpid()}"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
    except OSError as e:
        raise CheckpointError(f"output folder {run_dir} is not writable: {os_reason(e)}") from None
    finally:
        remove_quietly(probe)
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                break
    for stale in run_dir.glob(".*.tmp-*"):
        remove_quietly(stale)


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def _step_of(folder: Path) -> int:
    return int(folder.name.split("_")[1])


def step_folders(root: Path) -> list[Path]:
    """Folders named step_N, oldest first."""
    return sorted((p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()), key=_step_of)


def _write_folder(
    tmp: Path, step: int, adapter_weights: dict, adapter_config: dict, optimizer_state, state: dict
) -> None:
    mx.save_safetensors(str(tmp / "adapters.safetensors"), adapter_weights)
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(optimizer_state)))
    (tmp / "state.json").write_text(json.dumps(dict(state, step=step), indent=2, sort_keys=True))
    (tmp / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True))
    files = {}
    for f in sorted(tmp.iterdir()):
        fsync_file(f)
        files[f.name] = {"bytes": f.stat().st_size, "sha256": file_sha256(f)}
    # Written last: a folder with a manifest is a folder whose other files are complete.
    with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
        json.dump({"step": step, "files": files}, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)


def save_checkpoint(
    run_dir: Path,
    step: int,
    adapter_weights: dict,
    adapter_config: dict,
    optimizer_state,
    state: dict,
    keep_last: int = 2,
    keep_best: bool = False,
    metric: float | None = None,
) -> Path:
    """Write checkpoint `step` atomically and point `latest` at it.

    adapter_weights: flat {name: array} of the trained weights.
    optimizer_state: the optimizer's (nested) state tree.
    state: JSON-able trainer state (step, data position, random seeds, ...).
    metric: the eval accuracy at this step, if measured (keep_best keeps the highest).
    A failed write (disk full, no permission) raises CheckpointError and
    leaves the previous checkpoint and `latest` untouched.
    """
    root = Path(run_dir) / CHECKPOINTS
    final = root / checkpoint_name(step)
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        _write_folder(
            tmp, step, adapter_weights, adapter_config, optimizer_state, dict(state, eval_metric=metric)
        )
        if final.exists():  # a re-save of the same step: move the old one aside, never lose both
            aside = root / f".{final.name}.old-{os.getpid()}"
            os.replace(final, aside)
            os.replace(tmp, final)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(root)
    except (OSError, RuntimeError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        previous = latest_checkpoint(run_dir)
        kept = (
            f"the previous checkpoint {previous.name} is intact"
            if previous
            else "no earlier checkpoint exists"
        )
        raise CheckpointError(
            f"could not write checkpoint {final.name} in {root}: {os_reason(e)}; {kept}"
        ) from e
    atomic_write_text(root / "latest", final.name + "\n")
    _prune(root, keep_last, keep_best, keep=final.name)
    return final


def _complete(root: Path) -> list[Path]:
    """Checkpoint folders that finished writing (they have a manifest), oldest first."""
    return [p for p in step_folders(root) if (p / MANIFEST).is_file()]


def _metric(folder: Path) -> float | None:
    try:
        value = json.loads((folder / "state.json").read_text()).get("eval_metric")
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def best_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest eval metric (the earliest of equals)."""
    scored = [
        (m, -_step_of(p), p) for p in _complete(Path(run_dir) / CHECKPOINTS) if (m := _metric(p)) is not None
    ]
    return max(scored)[2] if scored else None


def _prune(root: Path, keep_last: int, keep_best: bool, keep: str) -> None:
    complete = _complete(root)
    keep_names = {keep} | {p.name for p in complete[-keep_last:]} if keep_last > 0 else {keep}
    if keep_best:
        best = best_checkpoint(root.parent)
        if best is not None:
            keep_names.add(best.name)
            atomic_write_text(root / "best", best.name + "\n")
    for old in complete:
        if old.name not in keep_names:
            shutil.rmtree(old, ignore_errors=True)
    for stale in [*root.glob(".step_*.tmp-*"), *root.glob(".step_*.old-*")]:  # left by a killed writer
        shutil.rmtree(stale, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint folder that finished writing (not yet checksummed)."""
    complete = _complete(Path(run_dir) / CHECKPOINTS)
    return complete[-1] if complete else None


def verify_checkpoint(folder: Path) -> str | None:
    """None when every file matches the manifest, else what is wrong."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST} is missing or unreadable (the checkpoint was never completed)"
    for name in ("adapters.safetensors", "optimizer.safetensors", "state.json"):
        if name not in files:
            return f"{MANIFEST} does not list {name}"
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected["bytes"]:
            return f"{name} has {size} bytes, expected {expected['bytes']}"
        if file_sha256(path) != expected["sha256"]:
            return f"{name} does not match its sha256 checksum"
    return None


def load_checkpoint(folder: Path):
    """Returns (adapter_weights, optimizer_state_tree, state); CheckpointError if damaged."""
    folder = Path(folder)
    problem = verify_checkpoint(folder)
    if problem:
        raise CheckpointError(f"checkpoint {folder} is corrupt: {problem}")
    try:
        state = json.loads((folder / "state.json").read_text())
        weights = mx.load(str(folder / "adapters.safetensors"))
        opt_flat = mx.load(str(folder / "optimizer.safetensors"))
    except (OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {folder} is unreadable: {e}") from e
    return weights, tree_unflatten(list(opt_flat.items())), state


def load_latest(run_dir: Path):
    """The newest intact checkpoint: (weights, optimizer_state, state, warnings), or None if there is none.

    Damaged or unfinished checkpoints are passed over with a warning naming
    them; if there are checkpoints but none is intact, CheckpointError.
    """
    root = Path(run_dir) / CHECKPOINTS
    problems, damaged = [], []
    for folder in reversed(step_folders(root)):
        try:
            weights, opt_state, state = load_checkpoint(folder)
        except CheckpointError as e:
            problems.append(str(e))
            damaged.append(folder)
            continue
        warnings = []
        for problem, bad in zip(problems, damaged):
            # Out of the way (the run will write this step again) but kept for a look.
            aside = root / f"corrupt-{bad.name}"
            shutil.rmtree(aside, ignore_errors=True)
            try:
                os.replace(bad, aside)
            except OSError:  # e.g. another process of a data-parallel run moved it first
                pass
            warnings.append(f"{problem}; resuming from {folder.name} instead (moved it to {aside.name})")
        return weights, opt_state, state, warnings
    if problems:
        raise CheckpointError(f"no intact checkpoint in {root}: " + "; ".join(problems))
    return None


def append_jsonl(path: Path, records: list[dict]) -> None:
    """One JSON line a record at the end of a run file (metrics.jsonl, health.jsonl, completions.jsonl)."""
    with open(path, "a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, default=str) + "\n")


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep only records of steps <= last_step (those the resumed checkpoint covers).

    A line cut short by a kill is not valid JSON; it is dropped too.
    """
    path = Path(path)
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("step", 0) <= last_step:
            kept.append(line + "\n")
    atomic_write_text(path, "".join(kept))
