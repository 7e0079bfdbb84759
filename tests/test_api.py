"""The public Python API: exported names, runnable docstring examples, the
step-by-step Trainer against the CLI's train(), metrics tables and plots."""

import dataclasses
import doctest
import sys
import types

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlx_grpo
from mlx_grpo import api
from mlx_grpo.files import training_rows
from mlx_grpo.setting_groups import SamplingSettings


def test_every_public_name_is_exported_and_documented():
    assert mlx_grpo.__all__ == api.__all__
    for name in mlx_grpo.__all__:
        obj = getattr(mlx_grpo, name)
        assert obj is getattr(api, name)
        assert obj.__doc__, name
    for name in ("Trainer", "train", "make_config", "sample_group", "score_group", "metrics_table"):
        assert ">>>" in getattr(mlx_grpo, name).__doc__, name  # an example to copy
    with pytest.raises(AttributeError):
        mlx_grpo.no_such_name


def test_docstring_examples_run():
    result = doctest.testmod(api, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 10 and result.failed == 0


def _weights(model):
    return {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}


def test_update_on_a_hand_scored_group_moves_weights_only_with_signal():
    # runaway_penalty 1: equal raw rewards stay equal whichever completions are cut
    trainer = mlx_grpo.Trainer(
        batch_size=2, group_size=4, max_tokens=16, lr=1e-3, warmup_steps=0, runaway_penalty=1.0
    )
    row = trainer.task.train_rows[0]
    group = trainer.sample(row["prompt"])
    assert len(group) == 4 and all(c.prompt_index == 0 for c in group)
    assert len(trainer.score(row, group).total) == 4

    before = _weights(trainer.model)
    flat = trainer.update([row], group, [0.5, 0.5, 0.5, 0.5])  # equal rewards: zero advantages
    assert flat["grad_norm"] == 0.0
    assert all(np.array_equal(before[k], v) for k, v in _weights(trainer.model).items())

    trainer.update([row], group, [1.0, 0.0, 0.0, 0.0])
    after = _weights(trainer.model)
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    with pytest.raises(ValueError):
        trainer.update([row, row], group[:3], [1, 0, 0])


def test_sample_group_takes_each_sampling_default_from_the_setting(monkeypatch):
    """A sampling setting left out is the `sampling` group's own default (one definition), a given one is
    kept."""
    seen = []
    monkeypatch.setattr(
        api, "sample_completions", lambda model, tokenizer, prompts, g, sampling, seed: seen.append(sampling)
    )
    monkeypatch.setattr(api, "encode_prompt", lambda tokenizer, prompt, system_prompt: [1, 2])
    model = types.SimpleNamespace(eval=lambda: None)
    mlx_grpo.sample_group(model, None, "What is 2 + 3?", 2)
    mlx_grpo.sample_group(model, None, "What is 2 + 3?", 2, max_tokens=5, temperature=0.5)
    assert seen[0] == SamplingSettings()
    assert seen[1] == dataclasses.replace(SamplingSettings(), max_tokens=5, temperature=0.5)


def test_trainer_steps_reproduce_the_cli_train_run(tmp_path):
    settings = dict(
        steps=2,
        batch_size=2,
        group_size=4,
        max_tokens=16,
        lr=1e-3,
        warmup_steps=0,
        eval_num_problems=2,
        seed=4,
    )
    run = mlx_grpo.train(output=str(tmp_path / "run"), **settings)
    trainer = mlx_grpo.Trainer(**settings)
    trainer.train(2)
    ran = mx.load(str(run.run_dir / "adapters.safetensors"))
    for k, v in _weights(trainer.model).items():
        np.testing.assert_array_equal(v, np.array(ran[k]))
    written = mlx_grpo.read_metrics(run.run_dir)
    assert [m["reward/mean"] for m in trainer.history] == [m["reward/mean"] for m in training_rows(written)]
    with pytest.raises(TypeError):
        mlx_grpo.train(mlx_grpo.make_config(), steps=3)


def test_metrics_table_is_a_dataframe_with_pandas_and_a_list_without(monkeypatch):
    rows = [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.75}]
    pd = pytest.importorskip("pandas")
    table = mlx_grpo.metrics_table(rows)
    assert isinstance(table, pd.DataFrame) and table["reward/mean"].tolist() == [0.5, 0.75]
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if pandas were not installed
    assert mlx_grpo.metrics_table(rows) == rows


def test_plot_metrics_draws_one_panel_per_key():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    rows = [{"step": 1, "reward/mean": 0.5, "kl": None}, {"step": 2, "reward/mean": 0.75, "kl": 0.01}]
    fig = mlx_grpo.plot_metrics(rows, ["reward/mean", "kl"])
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["reward/mean", "kl"]
    assert axes[0].lines[0].get_ydata().tolist() == [0.5, 0.75]
    assert axes[1].lines[0].get_xdata().tolist() == [2]  # None is not a point


def test_cli_train_calls_the_api(monkeypatch):
    from typer.testing import CliRunner

    from mlx_grpo import cli

    seen = []

    def fake_train(config, on_event=None):
        seen.append(config)
        return api.RunResult(run_dir=config.output, accuracy_before=None, accuracy_after=None, eval_n=0)

    monkeypatch.setattr(api, "train", fake_train)
    result = CliRunner().invoke(cli.app, ["train", "--steps", "3", "--output", "somewhere"])
    assert result.exit_code == 0, result.output
    assert len(seen) == 1 and seen[0].steps == 3 and seen[0].output == "somewhere"
