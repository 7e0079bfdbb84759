"""The warm start inside `train`: sft's stage into RUN/warm_start first, then GRPO from it."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import ConfigError, build_config
from mlx_grpo.models.loading import embedded_model_path
from mlx_grpo.run import loop, trainer
from mlx_grpo.run import warm_start as ws
from mlx_grpo.run.setup import setup
from mlx_grpo.tasks.registry import recommended_settings

pytestmark = pytest.mark.skipif(
    not (embedded_model_path() / "config.json").exists(),
    reason="the embedded model has not been built (scripts/build_tiny_model.py)",
)

EVAL_N = 16
# A warm-start lr that moves the accuracy in 4 steps and leaves GRPO groups with some wrong answers to learn
# from.
SETTINGS = {
    "task": "arith",
    "steps": 2,
    "batch_size": 4,
    "group_size": 4,
    "eval_num_problems": EVAL_N,
    "lora_rank": 4,
    "warmup_steps": 0,
    "lr": 1e-3,
    "warm_start_steps": 4,
    "warm_start_lr": 3e-4,
    "warm_start_batch_size": 4,
}


def _config(**values):
    return build_config({**SETTINGS, **values}, task_defaults=recommended_settings)


def _adapters(folder) -> dict:
    return {k: np.array(v) for k, v in mx.load(str(folder / "adapters.safetensors")).items()}


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class Interrupt(Exception):
    pass


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A warm-started run, with the weights GRPO's first step started from and the events heard."""
    run_dir = tmp_path_factory.mktemp("warm") / "run"
    first, events = [], []
    real_step = trainer.run_step

    def recording_step(run, step):
        if not first:
            first.append({k: np.array(v) for k, v in tree_flatten(run.model.trainable_parameters())})
        return real_step(run, step)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer, "run_step", recording_step)
        result = trainer.train(
            _config(output=str(run_dir)), on_event=lambda kind, data: events.append((kind, data))
        )
    return run_dir, result, first[0], events


def test_the_warm_start_is_a_complete_sft_run_inside_the_run(warm):
    run_dir, _, _, events = warm
    folder = run_dir / "warm_start"
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "health.jsonl",
        "adapters.safetensors",
        "adapter_config.json",
        "summary.json",
    ):
        assert (folder / name).is_file(), name
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["val_loss_after"] < summary["val_loss_before"]
    assert [m["step"] for m in _lines(folder / "metrics.jsonl") if "loss" in m] == [1, 2, 3, 4]
    heard = [data["kind"] for kind, data in events if kind == "warm_start"]
    assert heard[0] == "start" and heard.count("step") == 4 and heard[-1] == "end"
    assert [kind for kind, _ in events].index("start") > len(heard) - 1  # the stage first, then GRPO's start


def test_grpo_starts_from_the_warm_start_s_adapters_and_moves_every_matrix(warm):
    run_dir, _, first, _ = warm
    start = _adapters(run_dir / "warm_start")
    assert sorted(first) == sorted(start) and all(v.shape[-1] == 4 for k, v in start.items() if "lora_a" in k)
    assert all(np.array_equal(first[k], start[k]) for k in start)
    end = _adapters(run_dir)
    assert sorted(k for k in start if np.array_equal(start[k], end[k])) == []


def test_the_summary_names_the_base_the_warm_start_and_the_end(warm):
    run_dir, result, _, _ = warm
    warm_summary = json.loads((run_dir / "warm_start" / "summary.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["accuracy_before"] == warm_summary["accuracy_before"] == result.accuracy_before
    assert (
        summary["accuracy_after_warm_start"]
        == warm_summary["accuracy_after"]
        == result.accuracy_after_warm_start
    )
    assert warm_summary["accuracy_before"] != warm_summary["accuracy_after"]  # the warm start moved it
    # The middle figure is the warm start's own weights on the validation split, loaded as a model.
    state = setup(_config(model=str(run_dir / "warm_start"), warm_start_steps=0))
    evaluated = trainer.evaluate(state.model, state.tokenizer, state.task, state.config)
    assert evaluated["n"] == EVAL_N and evaluated["accuracy"] == pytest.approx(
        result.accuracy_after_warm_start
    )
    b, w, a = result.accuracy_before, result.accuracy_after_warm_start, result.accuracy_after
    assert summary["line"] == (
        f"accuracy {b:.2f} -> {w:.2f} after the warm start -> {a:.2f} ({a - b:+.2f}) "
        f"on {EVAL_N} held-out problems"
    )
    # GRPO's check before its first step is the warm start's after-check, on file, not measured again
    before_row = [m for m in _lines(run_dir / "metrics.jsonl") if m.get("before")]
    assert before_row == [{"step": 0, "eval/accuracy": w, "before": True}]


def test_the_run_folder_records_the_command_s_model_and_warm_start(warm):
    import yaml

    run_dir = warm[0]
    settings = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert settings["model"] is None and settings["warm_start_steps"] == 4  # resumable as given
    assert json.loads((run_dir / "adapter_config.json").read_text())["model"] == str(embedded_model_path())


def test_an_interrupted_grpo_stage_resumes_without_the_warm_start_again(warm, tmp_path):
    run_dir = tmp_path / "run"

    def stop_after_grpo_step_1(kind, data):
        if kind == "checkpoint" and data["step"] == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        trainer.train(_config(output=str(run_dir), save_every=1), on_event=stop_after_grpo_step_1)
    summary = run_dir / "warm_start" / "summary.json"
    stamp, rows = summary.stat().st_mtime_ns, len(_lines(run_dir / "warm_start" / "metrics.jsonl"))
    heard = []
    result = trainer.train(_config(resume=str(run_dir), save_every=1), on_event=lambda k, d: heard.append(k))
    assert "warm_start" not in heard
    assert (
        summary.stat().st_mtime_ns == stamp and len(_lines(run_dir / "warm_start" / "metrics.jsonl")) == rows
    )
    assert [m["step"] for m in result.history] == [2]
    assert result.accuracy_before == warm[1].accuracy_before
    assert result.accuracy_after_warm_start == warm[1].accuracy_after_warm_start


def test_an_interrupted_warm_start_is_continued_by_train_resume(warm, tmp_path):
    """Cut after the warm start's step 2 of 4; `train --resume RUN` (the CLI, reading RUN/config.yaml)
    finishes it with the uninterrupted warm start's weights, then runs GRPO."""
    run_dir = tmp_path / "run"

    def stop_in_the_warm_start(kind, data):
        if kind == "warm_start" and data["kind"] == "checkpoint" and data["data"]["step"] == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        trainer.train(_config(output=str(run_dir), save_every=2), on_event=stop_in_the_warm_start)
    assert not (run_dir / "warm_start" / "summary.json").exists() and (run_dir / "config.yaml").is_file()
    out = CliRunner().invoke(app, ["train", "--resume", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert "warm start: supervised steps before GRPO" in out.output and "resuming after step 2" in out.output
    steps = [m["step"] for m in _lines(run_dir / "warm_start" / "metrics.jsonl") if "loss" in m]
    assert steps == [1, 2, 3, 4]
    whole, resumed = _adapters(warm[0] / "warm_start"), _adapters(run_dir / "warm_start")
    assert all(np.array_equal(whole[k], resumed[k]) for k in whole)
    assert "after the warm start" in json.loads((run_dir / "summary.json").read_text())["line"]


def test_nested_and_flat_yaml_spellings(tmp_path):
    nested, flat, both = tmp_path / "nested.yaml", tmp_path / "flat.yaml", tmp_path / "both.yaml"
    nested.write_text("task: arith\nwarm_start: {steps: 40, lr: 1.0e-4, data: demos.jsonl}\n")
    flat.write_text(
        "task: arith\nwarm_start_steps: 40\nwarm_start_lr: 1.0e-4\nwarm_start_data: demos.jsonl\n"
    )
    a, b = build_config(config_file=str(nested)), build_config(config_file=str(flat))
    assert a.warm_start == b.warm_start and (a.warm_start.steps, a.warm_start.lr) == (40, 1e-4)
    assert (
        build_config({"warm_start_steps": 3}).warm_start.steps == 3 and build_config().warm_start.steps == 0
    )
    both.write_text("warm_start: {steps: 4}\nwarm_start_steps: 5\n")
    with pytest.raises(ConfigError, match="warm_start_steps is given twice"):
        build_config(config_file=str(both))
    with pytest.raises(ConfigError, match="warm_start_steps must be >= 0"):
        build_config({"warm_start_steps": -1})


def test_the_sft_stage_s_config_takes_the_group_over_the_shared_settings(tmp_path):
    config = _config(
        seed=7, micro_batch_size=3, max_grad_norm=0.5, warm_start_data="demos.jsonl", warm_start_batch_size=3
    )
    stage = ws.warm_start_config(config, tmp_path / "warm_start", resume=False)
    assert (stage.steps, stage.lr, stage.batch_size, stage.data) == (4, 3e-4, 3, "demos.jsonl")
    assert (stage.seed, stage.micro_batch_size, stage.max_grad_norm, stage.lora_rank) == (7, 3, 0.5, 4)
    assert stage.output == str(tmp_path / "warm_start") and stage.warm_start.steps == 0


def test_a_task_without_demonstrations_needs_warm_start_data(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"prompt": "p", "answer": "a"}\n')
    config = build_config(
        {"data": str(tmp_path / "rows.jsonl"), "warm_start_steps": 2, "output": str(tmp_path / "run")}
    )
    with pytest.raises(ConfigError, match="warm_start_steps needs warm_start_data"):
        trainer.train(config)
    assert not (tmp_path / "run").exists()


def test_the_time_limit_counts_the_warm_start(tmp_path, monkeypatch):
    """A warm start taking 50 of 55 minutes: GRPO's stop rule sees those 50 minutes; one taking 60 of them
    leaves GRPO no step, and the run ends on the warm start's weights."""
    offset = [0.0]
    real = trainer.time.perf_counter

    class Clock:
        @staticmethod
        def perf_counter():
            return real() + offset[0]

    monkeypatch.setattr(trainer, "time", Clock)  # the run's start, and the loop's clock
    monkeypatch.setattr(loop, "time", Clock)
    real_stage = trainer.run_warm_start

    def slow_stage(config, run_dir, emit):
        stage = real_stage(config, run_dir, emit)
        offset[0] += minutes * 60
        return stage

    monkeypatch.setattr(trainer, "run_warm_start", slow_stage)
    seen = []
    real_rule = loop.past_time_limit

    # the stage's steps go through the same loop, with no limit of their own: they are not cut
    def rule(c, elapsed, history, eval_seconds):
        seen.append((c.time_limit_minutes, elapsed))
        return real_rule(c, elapsed, history, eval_seconds)

    monkeypatch.setattr(loop, "past_time_limit", rule)

    minutes = 50
    trainer.train(_config(output=str(tmp_path / "a"), time_limit_minutes=55, warm_start_steps=1))
    grpo = [elapsed for limit, elapsed in seen if limit]
    assert grpo and min(grpo) >= 50 * 60 and {limit for limit, _ in seen} == {0, 55}
    minutes, events = 60, []
    result = trainer.train(
        _config(output=str(tmp_path / "b"), time_limit_minutes=55, warm_start_steps=1),
        on_event=lambda kind, data: events.append((kind, data)),
    )
    assert result.history == [] and [d for k, d in events if k == "time_limit"][0]["step"] == 0
    assert np.all(
        [
            np.array_equal(v, _adapters(tmp_path / "b" / "warm_start")[k])
            for k, v in _adapters(tmp_path / "b").items()
        ]
    )
    assert result.accuracy_after == pytest.approx(result.accuracy_after_warm_start)


def test_no_warm_start_by_default(tmp_path):
    events = []
    result = trainer.train(
        _config(output=str(tmp_path / "run"), warm_start_steps=0, steps=1),
        on_event=lambda kind, data: events.append(kind),
    )
    assert not (tmp_path / "run" / "warm_start").exists() and "warm_start" not in events
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "accuracy_after_warm_start" not in summary and result.accuracy_after_warm_start is None
    assert summary["line"].startswith(
        f"accuracy {result.accuracy_before:.2f} -> {result.accuracy_after:.2f} ("
    )


def test_sft_and_the_step_by_step_trainer_refuse_a_warm_start():
    from mlx_grpo.api import Trainer
    from mlx_grpo.run.sft_setup import sft_setup

    with pytest.raises(ConfigError, match="warm_start_steps is train's"):
        sft_setup(_config())
    with pytest.raises(ConfigError, match="warm_start_web_kinds is train's"):
        sft_setup(build_config({"task": "web", "warm_start_web_kinds": ["fact/1"]}))
    with pytest.raises(ConfigError, match="the warm start runs inside train"):
        Trainer(_config())


def test_overwrite_removes_an_earlier_warm_start(warm, tmp_path):
    import shutil

    from mlx_grpo.run.run_folder import prepare_run_folder

    run_dir = tmp_path / "run"
    shutil.copytree(warm[0], run_dir)
    prepare_run_folder(run_dir, resume=False, overwrite=True)
    assert not (run_dir / "warm_start").exists() and not (run_dir / "adapters.safetensors").exists()


def test_warm_start_web_kinds_chooses_the_stage_s_demonstrations_only(tmp_path):
    from rewards.web_browsing.training import load_rows

    config = build_config(
        {"task": "web", "web_kinds": [], "warm_start_steps": 4, "warm_start_web_kinds": ["fact/1", "shop/1"]}
    )
    stage = ws.warm_start_config(config, tmp_path / "warm_start", resume=False)
    assert stage.task_options.web_kinds == ["fact/1", "shop/1"] and config.task_options.web_kinds == []
    assert stage.warm_start.web_kinds == [] and stage.warm_start.steps == 0  # the stage is a plain sft run
    assert {row["kind"] for row in load_rows("train", stage)} == {"fact/1", "shop/1"}
    assert len({row["kind"] for row in load_rows("train", config)}) == 12  # GRPO still draws every kind
    unset = build_config({"task": "web", "web_kinds": ["travel/2"], "warm_start_steps": 4})
    assert ws.warm_start_config(unset, tmp_path / "w", resume=False).task_options.web_kinds == ["travel/2"]
    with pytest.raises(ConfigError, match="warm_start_web_kinds chooses the web task's demonstrations"):
        build_config({"task": "arith", "warm_start_web_kinds": ["fact/1"]})


@pytest.mark.parametrize("stage_kinds, reused", [([], True), (["fact/1"], False)])
def test_a_stage_on_other_kinds_is_not_the_run_s_check(tmp_path, stage_kinds, reused):
    """The stage's checks before and after are on its own kinds' tasks: the run reuses them only when those
    are its own."""
    folder = tmp_path / "run" / ws.WARM_START_DIR
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(
        json.dumps({"accuracy_before": 0.25, "accuracy_after": 0.5, "eval_n": 12, "eval_seconds": 3.0})
    )
    config = build_config(
        {
            "task": "web",
            "warm_start_steps": 4,
            "warm_start_web_kinds": stage_kinds,
            "resume": str(tmp_path / "run"),
        }
    )
    stage = ws.run_warm_start(config, tmp_path / "run", emit=lambda kind, data: None)
    assert not stage.ran_now
    if reused:
        assert stage.accuracy_before == 0.25 and stage.check == {"accuracy": 0.5, "n": 12, "seconds": 3.0}
    else:
        assert stage.accuracy_before is None and stage.check is None


@pytest.mark.parametrize("stage_data, reused", [(None, True), ("other-rows.jsonl", False)])
def test_a_stage_on_other_data_is_not_the_run_s_check(tmp_path, stage_data, reused):
    """A warm start on data of its own (warm_start_data) checked that data's validation rows, not the run's:
    the run's summary then sets no figure of those rows beside its own, and GRPO makes its own check."""
    folder = tmp_path / "run" / ws.WARM_START_DIR
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(
        json.dumps({"accuracy_before": 0.25, "accuracy_after": 0.5, "eval_n": 12, "eval_seconds": 3.0})
    )
    values = {"task": "arith", "warm_start_steps": 4, "resume": str(tmp_path / "run")}
    config = build_config({**values, **({"warm_start_data": stage_data} if stage_data else {})})
    stage = ws.run_warm_start(config, tmp_path / "run", emit=lambda kind, data: None)
    if reused:
        assert stage.accuracy_before == 0.25 and stage.check == {"accuracy": 0.5, "n": 12, "seconds": 3.0}
    else:
        assert stage.accuracy_before is None and stage.check is None
