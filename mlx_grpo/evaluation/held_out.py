"""The check that `compare` and `eval` never score a model on a row any stage of it trained on.

A run records the keys of its train rows (tasks/splits.py, trained_rows.json). A model's stages are its
own run, the warm start inside it (RUN/warm_start), and, down the chain, every run it was started from
(`--model RUN`). Scoring a held-out split (validation or test) on a row whose prompt any stage recorded
stops with one line; `--split train` asks for training rows and is not checked. A run folder made before
runs kept the record cannot be checked: that is said once, as a warning in the report.
"""

from __future__ import annotations

from pathlib import Path

from ..models.run_models import is_run_folder, run_dir_of
from ..tasks.splits import TRAINED_ROWS, read_training_keys, row_key
from ..run.warm_start import WARM_START_DIR
from ..config import load_yaml
from .model_names import CompareError, ModelSpec


def stages(run_dir: Path | None) -> list[Path]:
    """The run folders whose training a model carries: its run, its warm start, the runs it started from."""
    found: list[Path] = []
    while run_dir is not None and run_dir not in found and len(found) < 64:
        found.append(run_dir)
        if (run_dir / WARM_START_DIR / "config.yaml").is_file():
            found.append(run_dir / WARM_START_DIR)
        try:
            model = load_yaml(run_dir / "config.yaml").get("model")
        except Exception:  # an unreadable config.yaml: the model's loading says what is wrong with it
            break
        run_dir = run_dir_of(Path(model).expanduser()) if is_run_folder(model) else None
    return found


def check_held_out(specs: list[ModelSpec], rows: list[dict], split: str) -> list[str]:
    """Warnings for stages that cannot be checked; CompareError when a scored row is a stage's training
    row."""
    if split == "train":
        return []
    keys = [row_key(r) for r in rows]
    warnings = []
    for spec in specs:
        for stage in stages(spec.run_dir):
            trained = read_training_keys(stage)
            if trained is None:
                warnings.append(
                    f"{stage} has no readable {TRAINED_ROWS} (a run folder from before runs recorded "
                    f"their training rows): whether its {split} rows were held out cannot be checked"
                )
                continue
            overlap = sum(k in trained for k in keys)
            if overlap:
                raise CompareError(
                    f"{overlap} of the {len(rows)} {split} rows were training rows of {stage} (its "
                    f"{TRAINED_ROWS}): "
                    "score it on the data and task it was trained with, whose held-out rows it never saw, or "
                    "on "
                    "other data"
                )
    return list(dict.fromkeys(warnings))
