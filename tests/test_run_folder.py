"""A fresh run into a folder that holds an earlier run stops (one line, before the model loads, nothing
touched) instead of appending to its metrics and leaving its checkpoints beside the new ones;
--overwrite removes the earlier run's files, and only those; --resume continues as before."""

import json

import pytest
from typer.testing import CliRunner

import mlx_grpo
from mlx_grpo.cli import app
from mlx_grpo.config import build_config
from mlx_grpo.files import CheckpointError
from mlx_grpo.run import run_folder
from mlx_grpo.run import setup as run_setup
from mlx_grpo.run.trainer import train


@pytest.fixture
def flags(tiny_model_path, variety_task):
    """The command line's flags of a tiny custom run (conftest's variety_task), by name."""
    return dict(
        model=str(tiny_model_path),
        **variety_task,
        batch_size=2,
        group_size=2,
        max_tokens=6,
        lr=1e-2,
        save_every=1,
        seed=3,
        warmup_steps=0,
        eval_num_problems=3,
    )


def cli_args(flags: dict, **more) -> list[str]:
    args = []
    for name, value in {**flags, **more}.items():
        for v in value if isinstance(value, list) else [value]:
            args += [f"--{name.replace('_', '-')}", str(v)]
    return args


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def steps_of(path) -> list[int]:
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if "final" not in r]


@pytest.fixture
def earlier_run(tmp_path, flags):
    """A finished 3-step run, with the report and plot a user makes of it."""
    run_dir = tmp_path / "run"
    train(build_config({**flags, "steps": 3, "keep_checkpoints": 3, "output": str(run_dir)}))
    (run_dir / "compare").mkdir()
    (run_dir / "compare" / "report.md").write_text("the earlier run's report")
    (run_dir / "plot.png").write_bytes(b"earlier plot")
    return run_dir


def test_a_fresh_run_into_a_run_folder_stops_before_the_model_and_touches_nothing(
    earlier_run, flags, monkeypatch
):
    before = snapshot(earlier_run)
    expected = (
        f"--output {earlier_run} already holds a run (metrics.jsonl, 3 checkpoints, adapters.safetensors): "
        f"--resume {earlier_run} to continue it, or another --output (or --overwrite to start again there)"
    )

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(run_setup, "load_policy", no_model)
    result = CliRunner().invoke(app, ["train", *cli_args(flags, steps=2, output=earlier_run)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: {expected}"
    with pytest.raises(CheckpointError) as raised:  # the Python API goes through the same check
        mlx_grpo.train(**flags, steps=2, output=str(earlier_run))
    assert str(raised.value) == expected
    assert snapshot(earlier_run) == before  # byte for byte
    assert sorted(p.name for p in earlier_run.iterdir()) == sorted({p.split("/")[0] for p in before})


def test_overwrite_starts_again_removing_only_the_earlier_runs_files(earlier_run, flags):
    (earlier_run / "notes.txt").write_text("mine")
    (earlier_run / "mine").mkdir()
    (earlier_run / "mine" / "data.jsonl").write_text("{}\n")
    result = CliRunner().invoke(app, ["train", *cli_args(flags, steps=2, output=earlier_run), "--overwrite"])
    assert result.exit_code == 0, result.output

    assert steps_of(earlier_run / "metrics.jsonl") == [
        0,
        1,
        2,
    ]  # the new run's, once each (0: before training)
    assert sorted(
        {r["step"] for r in map(json.loads, (earlier_run / "completions.jsonl").read_text().splitlines())}
    ) == [1, 2]
    checkpoints = earlier_run / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == [
        "step_000001",
        "step_000002",
    ]  # no stale step 3
    assert (checkpoints / "latest").read_text().strip() == "step_000002"
    assert not (earlier_run / "compare").exists() and not (earlier_run / "plot.png").exists()
    assert json.loads((earlier_run / "summary.json").read_text())["steps"] == 2
    assert (earlier_run / "notes.txt").read_text() == "mine"  # the user's own files stay
    assert (earlier_run / "mine" / "data.jsonl").read_text() == "{}\n"
    assert "overwrite: false" in (earlier_run / "config.yaml").read_text()  # it acted once, on that start

    # --resume continues the overwritten run (its config.yaml does not ask to overwrite again)
    result = CliRunner().invoke(app, ["train", "--resume", str(earlier_run), "--steps", "3"])
    assert result.exit_code == 0, result.output
    assert steps_of(earlier_run / "metrics.jsonl") == [0, 1, 2, 3]  # not evaluated before training again
    assert (earlier_run / "notes.txt").read_text() == "mine"


def test_resume_continues_a_finished_run_in_its_folder(earlier_run, flags):
    kept = (earlier_run / "compare" / "report.md").read_bytes()
    train(
        build_config(
            {"resume": str(earlier_run), "output": str(earlier_run), "steps": 4},
            str(earlier_run / "config.yaml"),
        )
    )
    assert steps_of(earlier_run / "metrics.jsonl") == [0, 1, 2, 3, 4]
    assert (earlier_run / "compare" / "report.md").read_bytes() == kept  # resume removes nothing


def test_resume_and_overwrite_together_are_one_line(tmp_path, flags):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("steps: 2\n")
    result = CliRunner().invoke(app, ["train", "--resume", str(tmp_path / "run"), "--overwrite"])
    assert result.exit_code == 2, result.output
    assert (
        result.output.strip() == "error: --overwrite starts a run again and --resume continues it: give one"
    )


def test_what_counts_as_an_earlier_run(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    assert run_folder.earlier_run(folder) == []  # empty: fine
    (folder / "notes.txt").write_text("mine")
    (folder / "config.yaml").write_text("steps: 2\n")  # e.g. the --config the run is started with
    (folder / "metrics.jsonl").write_text("")  # a run that stopped before its first step
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / ".step_000001.tmp-1").mkdir()  # an unfinished write is no checkpoint
    assert run_folder.earlier_run(folder) == []
    run_folder.prepare_run_folder(folder, resume=False, overwrite=False)
    assert (folder / "notes.txt").exists() and (folder / "config.yaml").exists()

    (folder / "checkpoints" / "step_000001").mkdir()
    assert run_folder.earlier_run(folder) == ["1 checkpoint"]
    (folder / "adapters.safetensors").write_bytes(b"x")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    assert run_folder.earlier_run(folder) == ["metrics.jsonl", "1 checkpoint", "adapters.safetensors"]
    run_folder.prepare_run_folder(folder, resume=True, overwrite=False)  # a resume is that run's own
    with pytest.raises(CheckpointError, match="already holds a run"):
        run_folder.prepare_run_folder(folder, resume=False, overwrite=False)

    run_folder.prepare_run_folder(folder, resume=False, overwrite=True)
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "notes.txt"]
