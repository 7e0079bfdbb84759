"""One setup for the command line and the Python API (run/setup.py): the API's Trainer takes the
same first steps as `mlx-grpo train` with the same settings and seed."""

import json

import pytest
from typer.testing import CliRunner

import mlx_grpo
from mlx_grpo.cli import app
from mlx_grpo.files import training_rows

SETTINGS = {
    "steps": 2,
    "batch_size": 2,
    "group_size": 4,
    "max_tokens": 16,
    "eval_num_problems": 2,
    "seed": 3,
    "warmup_steps": 0,
    "lr": 1e-3,
}
# Measured, not computed: wall-clock times, rates and memory differ between any two runs.
UNTIMED = ("time/", "tokens_per_s", "memory/")


def _flags(settings: dict) -> list[str]:
    return [part for name, value in settings.items() for part in (f"--{name.replace('_', '-')}", str(value))]


def _cli_steps(tmp_path, settings: dict) -> list[dict]:
    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["train", *_flags(settings), "--output", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return training_rows(rows)


def _same(cli: dict, api: dict) -> None:
    keys = {k for k in cli if not any(part in k for part in UNTIMED)}
    assert keys == {k for k in api if not any(part in k for part in UNTIMED)}
    for key in sorted(keys):
        a, b = cli[key], api[key]
        if isinstance(a, float) and isinstance(b, float):
            assert b == pytest.approx(a, rel=1e-6, abs=1e-9), key
        else:
            assert a == b, key


@pytest.mark.parametrize(
    "extra", [{}, {"fine_tune_type": "full", "kl_every": 1}], ids=["defaults", "full-kl-every-step"]
)
def test_the_api_takes_the_cli_steps(tmp_path, extra):
    settings = {**SETTINGS, **extra}
    cli = _cli_steps(tmp_path, settings)
    trainer = mlx_grpo.Trainer(**settings)
    api = trainer.train(2)
    assert [m["step"] for m in cli] == [1, 2]
    for c, a in zip(cli, api):
        _same(c, a)
    if extra:  # full fine-tuning keeps a copy of the starting weights to measure KL against
        assert trainer.ref_params is not None
        assert api[1]["kl"] > 0  # step 2's policy has moved from the reference (2834b18's API logged 0)


def test_the_api_checks_and_prefilters_as_train_does(tmp_path, monkeypatch):
    from mlx_grpo.config import ConfigError

    with pytest.raises(ConfigError, match="guide needs group_size >= 2"):
        mlx_grpo.Trainer(task="web", guide=True, group_size=1)
    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path / "cache"))
    trainer = mlx_grpo.Trainer(**SETTINGS, prefilter=4, prefilter_prompts=16, temperature=1.5)
    assert any(note.startswith("prefilter: kept") for note in trainer.notes)
    assert 0 < len(trainer.task.train_rows) < 16  # the prompts the base model solves sometimes, not always
