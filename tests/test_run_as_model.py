"""A run folder as a model: `train --model SFT_RUN` continues that run's adapters on its original base."""

import json

import mlx.core as mx
import numpy as np
import pytest
import yaml
from mlx.utils import tree_flatten
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import ConfigError, build_config, dump_yaml
from mlx_grpo.models.adapters import prepare_for_training, save_adapters
from mlx_grpo.models.loading import embedded_model_path, load_policy
from mlx_grpo.run.setup import setup
from mlx_grpo.run.sft import sft
from mlx_grpo.run.trainer import train
from mlx_grpo.tasks.registry import recommended_settings

pytestmark = pytest.mark.skipif(
    not (embedded_model_path() / "config.json").exists(),
    reason="the embedded model has not been built (scripts/build_tiny_model.py)",
)

EVAL_N = 16
GRPO = {"task": "arith", "steps": 3, "batch_size": 2, "group_size": 4, "eval_num_problems": EVAL_N}


def _config(**values):
    return build_config(values, task_defaults=recommended_settings)


def _adapters(run) -> dict:
    return {k: np.array(v) for k, v in mx.load(str(run / "adapters.safetensors")).items()}


def _unmoved(start: dict, end: dict) -> list[str]:
    assert start.keys() == end.keys()
    return sorted(k for k in start if np.array_equal(start[k], end[k]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An SFT run (lora rank 4, a high lr: its lora_b well away from zero, its accuracy moved), and a GRPO run
    started from it."""
    root = tmp_path_factory.mktemp("runs")
    sft_run, rl_run = root / "sft", root / "rl"
    sft_result = sft(
        _config(
            task="arith",
            steps=6,
            batch_size=4,
            lr=1e-3,
            warmup_steps=0,
            lora_rank=4,
            eval_num_problems=EVAL_N,
            output=str(sft_run),
        )
    )
    rl_result = train(_config(**GRPO, model=str(sft_run), output=str(rl_run)))
    return sft_run, rl_run, sft_result, rl_result


def test_grpo_from_an_sft_run_moves_every_adapter_matrix(runs):
    sft_run, rl_run, _, _ = runs
    start, end = _adapters(sft_run), _adapters(rl_run)
    assert {k.rsplit(".", 1)[1] for k in start} == {"lora_a", "lora_b"} and len(
        start
    ) == 28  # 2 blocks x 7 linears
    assert all(np.abs(v).max() > 0 for k, v in start.items() if k.endswith("lora_b"))
    assert _unmoved(start, end) == []
    assert all(v.shape[-1 if k.endswith("lora_a") else 0] == 4 for k, v in end.items())  # the SFT run's rank


def test_the_first_step_starts_from_the_sft_weights(runs):
    sft_run, rl_run, sft_result, rl_result = runs
    out = sft_run.parent / "eval-sft"
    result = CliRunner().invoke(
        app,
        ["eval", "--model", str(sft_run), "--split", "validation", "--n", str(EVAL_N), "--output", str(out)],
    )  # the rows a run checks itself on
    assert result.exit_code == 0, result.output
    evaluated = json.loads((out / "report.json").read_text())["models"]["model"]["accuracy"]
    assert sft_result.accuracy_after != sft_result.accuracy_before  # the SFT steps moved the accuracy
    assert rl_result.accuracy_before == pytest.approx(evaluated)
    assert rl_result.accuracy_before == pytest.approx(sft_result.accuracy_after)


def test_the_first_step_measures_the_start_s_distance_from_the_base(runs):
    """The reference is the original base: a run continuing SFT adapters does not start at KL 0."""
    _, _, _, rl_result = runs
    kls = [m["kl"] for m in rl_result.history]
    assert kls[0] is not None and kls[0] > 1e-4, (
        kls
    )  # measured, though kl_every (10) is past the run's 3 steps
    assert kls[1:] == [None, None]


def test_the_new_run_records_its_start_and_names_the_original_base(runs):
    sft_run, rl_run, _, _ = runs
    settings = yaml.safe_load((rl_run / "config.yaml").read_text())
    assert settings["model"] == str(sft_run) and settings["lora_rank"] == 4
    adapter_config = json.loads((rl_run / "adapter_config.json").read_text())
    assert adapter_config["model"] == str(embedded_model_path())
    assert adapter_config["lora_parameters"]["rank"] == 4
    # mlx-lm loads the new run on the base its adapter config names: the run's own weights
    model, _ = load_policy(adapter_config["model"], str(rl_run))
    loaded = {k: np.array(v) for k, v in tree_flatten(model.parameters()) if "lora" in k}
    assert _unmoved(_adapters(rl_run), loaded) == sorted(loaded)


def test_compare_a_run_of_a_run_against_the_original_base(runs, tmp_path):
    sft_run, rl_run, _, _ = runs
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["compare", "--trained", str(rl_run), "--n", "8", "--output", str(out)])
    assert result.exit_code == 0, result.output
    models = json.loads((out / "report.json").read_text())["models"]
    assert models["base"] == {**models["base"], "model": "embedded", "adapter": None}
    assert models["trained"]["model"] == "embedded" and models["trained"]["adapter"] == str(rl_run)


def test_compare_asks_whether_rl_added_anything_to_sft(runs, tmp_path):
    sft_run, rl_run, _, rl_result = runs
    out = tmp_path / "report"
    result = CliRunner().invoke(
        app,
        [
            "compare",
            "--base",
            str(sft_run),
            "--trained",
            str(rl_run),
            "--split",
            "validation",
            "--n",
            str(EVAL_N),
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    base, trained = report["models"]["base"], report["models"]["trained"]
    assert base["model"] == trained["model"] == "embedded"
    assert (base["adapter"], trained["adapter"]) == (str(sft_run), str(rl_run))
    assert base["accuracy"] == pytest.approx(rl_result.accuracy_before)
    assert trained["accuracy"] == pytest.approx(rl_result.accuracy_after)


def test_a_lora_run_with_lora_b_still_zero_moves_every_matrix(tmp_path):
    """Adapters saved as they were made (lora_b all zero): lora_a gets no gradient until lora_b moves, and
    both must have moved after a few steps of GRPO, not stay put with only a KL pull on them."""
    start = tmp_path / "fresh"
    model, _ = load_policy(None)
    adapter_config = prepare_for_training(
        model, "lora", {"rank": 8, "scale": 20.0, "dropout": 0.0, "num_layers": -1}
    )
    save_adapters(model, start, {**adapter_config, "model": str(embedded_model_path())})
    (start / "config.yaml").write_text(dump_yaml(_config(task="arith")))
    before = _adapters(start)
    assert all(not v.any() for k, v in before.items() if k.endswith("lora_b"))
    train(_config(**GRPO, model=str(start), output=str(tmp_path / "rl"), lr=1e-3, beta=0.05))
    assert _unmoved(before, _adapters(tmp_path / "rl")) == []


def test_the_run_s_adapter_settings_win_and_a_clashing_one_is_refused(runs, tmp_path):
    sft_run = runs[0]
    state = setup(_config(**GRPO, model=str(sft_run)))
    assert state.config.lora_rank == 4 and state.adapter_config["lora_parameters"]["rank"] == 4
    trainable = dict(tree_flatten(state.model.trainable_parameters()))
    assert _unmoved(_adapters(sft_run), {k: np.array(v) for k, v in trainable.items()}) == sorted(trainable)
    with pytest.raises(ConfigError, match="lora_rank 4, not 16"):
        setup(_config(**GRPO, model=str(sft_run), lora_rank=16))
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            str(sft_run),
            "--fine-tune-type",
            "dora",
            "--steps",
            "1",
            "--output",
            str(tmp_path / "x"),
        ],
    )
    assert result.exit_code == 2 and "fine_tune_type lora, not dora" in result.output
    assert not (tmp_path / "x").exists()
