"""A run folder made ready for a run: the one check, for `train` and the API alike (setup.py calls it).

A fresh run (not `--resume`) into a folder that already holds a run (a metrics.jsonl with
content, a step checkpoint, adapters.safetensors) would append to the earlier run's
metrics.jsonl and completions.jsonl and leave its later checkpoints beside the new ones:
one folder, two runs mixed. It stops instead, before the model loads, naming what is there.
With `--overwrite` the files a run writes are removed first, and only those: a folder may
hold the user's own files. An empty folder, or one with only other files, is used as it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..files import CheckpointError, os_reason
from ..tasks.splits import TRAINED_ROWS
from . import checkpoint as ckpt

# What a run (and `compare`, `plot` on it) writes into its folder: what --overwrite removes.
# config.yaml is left: the new run replaces it (and it may be the --config the new run was read from).
RUN_FILES = (
    "metrics.jsonl",
    "completions.jsonl",
    "health.jsonl",
    "summary.json",
    "prompt.txt",
    "adapters.safetensors",
    "adapter_config.json",
    "plot.png",
    TRAINED_ROWS,
)
RUN_FOLDERS = (ckpt.CHECKPOINTS, "compare", "tensorboard", "warm_start")  # warm_start: warm_start.py's stage


def earlier_run(run_dir: Path) -> list[str]:
    """What in `run_dir` shows an earlier run: e.g. ["metrics.jsonl", "3 checkpoints"]; empty if none."""
    run_dir = Path(run_dir)
    found = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append("metrics.jsonl")
    steps = len(ckpt.step_folders(run_dir / ckpt.CHECKPOINTS))
    if steps:
        found.append(f"{steps} checkpoint{'s' if steps > 1 else ''}")
    if (run_dir / "adapters.safetensors").exists():
        found.append("adapters.safetensors")
    return found


def remove_earlier_run(run_dir: Path) -> None:
    """Remove the files and folders a run writes (RUN_FILES, RUN_FOLDERS) from `run_dir`; nothing else."""
    run_dir = Path(run_dir)
    try:
        for name in RUN_FOLDERS:
            if (run_dir / name).is_dir() and not (run_dir / name).is_symlink():
                shutil.rmtree(run_dir / name)
        for name in (*RUN_FILES, *RUN_FOLDERS):
            if (run_dir / name).is_file() or (run_dir / name).is_symlink():
                (run_dir / name).unlink()
    except OSError as e:
        raise CheckpointError(
            f"--overwrite {run_dir}: the earlier run's files could not be removed: {os_reason(e)}"
        ) from None


def prepare_run_folder(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Check `run_dir` before the model loads: writable, and for a fresh run not holding an earlier
    run (CheckpointError naming it), unless `overwrite`, which removes that run's files first."""
    found = [] if resume else earlier_run(run_dir)
    if found and not overwrite:
        raise CheckpointError(
            f"--output {run_dir} already holds a run ({', '.join(found)}): --resume {run_dir} "
            "to continue it, or another --output (or --overwrite to start again there)"
        )
    ckpt.ensure_writable(run_dir)
    if overwrite and not resume:
        remove_earlier_run(run_dir)
