"""`compare` and `eval`: same prompts and seeds for both models, paired statistics, reports."""

import importlib.util
import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import build_config
from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.evaluation import compare_report as cmp_report
from mlx_grpo.sampling.heldout import evaluate_accuracy
from mlx_grpo.models.loading import embedded_model_path, load_policy
from mlx_grpo.run.trainer import train
from mlx_grpo.tasks.registry import recommended_settings

from compare_setup import task_and_settings

needs_embedded = pytest.mark.skipif(
    not (embedded_model_path() / "config.json").exists(),
    reason="the embedded model has not been built (scripts/build_tiny_model.py)",
)


def test_model_against_itself_is_a_zero_difference(tiny_model_path, tmp_path):
    spec = cmp.ModelSpec(str(tiny_model_path))
    task, settings = task_and_settings(str(tiny_model_path))
    report = cmp.compare(spec, spec, task, settings)
    assert report.data["difference"] == 0.0 and report.data["ci"] == [0.0, 0.0]
    assert report.data["p_value"] == 1.0 and not report.data["significant"]
    assert report.data["ties"] == 12 and report.data["test"] == "mcnemar-exact"
    written = cmp_report.write_report(report, tmp_path / "out")
    names = {p.name for p in written}
    assert {"report.json", "report.md", "rows.jsonl"} <= names
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["models"]["base"]["reward"] == saved["models"]["trained"]["reward"]
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(r["outcome"] == "tied" for r in rows)
    assert (
        rows[0]["prompt"] == task.test_rows[0]["prompt"] and rows[0]["columns"]["answer"]
    )  # the default split
    assert rows[0]["base"]["completions"] == rows[0]["trained"]["completions"]


def test_sampled_self_comparison_uses_the_same_seeds(tiny_model_path):
    """At temperature 1 with 3 samples, the same model gives the very same completions twice.

    The chunk size (concurrency // samples) is small here so several seeded chunks run.
    """
    spec = cmp.ModelSpec(str(tiny_model_path))
    task, settings = task_and_settings(str(tiny_model_path), n=8, max_tokens=6, samples=3)
    settings.concurrency = 6  # two prompts a chunk
    # sampling several: the run's temperature (here the arith task's recommendation for a chat model)
    assert settings.sampling.temperature == recommended_settings("arith", str(tiny_model_path))["temperature"]
    report = cmp.compare(spec, spec, task, settings)
    base, trained = report.results
    assert [a.tokens for a in base.answers] == [a.tokens for a in trained.answers]
    assert len({tuple(a.tokens) for a in base.answers}) > 1  # really sampled
    assert report.data["difference"] == 0.0 and report.data["p_value"] == 1.0
    assert "wilcoxon" in report.data["test"]
    assert set(report.data["models"]["base"]["pass_at_k"]) == {"1", "2", "3"}
    # another seed draws other completions
    settings.seed = 1
    other = cmp.evaluate(spec, task, settings).results[0]
    assert [a.tokens for a in other.answers] != [a.tokens for a in base.answers]


@needs_embedded
def test_eval_matches_the_trainers_accuracy_and_pass_at_k(tmp_path):
    """The single-model report agrees with evaluate_accuracy (a run's check: the validation split); pass@1 is
    the mean accuracy."""
    task, settings = task_and_settings(None, n=40, max_tokens=48, split="validation")
    report = cmp.evaluate(cmp.ModelSpec(None), task, settings)
    model, tokenizer = load_policy(None)
    expected = evaluate_accuracy(model, tokenizer, task, 48)
    summary = report.data["models"]["model"]
    assert summary["accuracy"] == pytest.approx(expected["accuracy"])
    assert [a.text for a in report.results[0].answers] == expected["completions"]
    assert summary["truncated_frac"] == pytest.approx(expected["truncated_frac"])

    task, settings = task_and_settings(None, n=20, max_tokens=48, samples=4, split="validation")
    result = cmp.evaluate(cmp.ModelSpec(None), task, settings).results[0]
    s = result.summary()
    right = (result.accuracy.reshape(20, 4) >= 1).sum(axis=1)
    assert s["pass_at_k"]["1"] == pytest.approx(s["accuracy"])
    assert s["pass_at_k"]["4"] == pytest.approx(np.mean(right > 0))  # pass@K: any of the K right
    assert s["pass_at_k"]["1"] <= s["pass_at_k"]["2"] <= s["pass_at_k"]["4"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A short default run: 10 GRPO steps of the embedded model on arith (0.31 -> 0.93 measured)."""
    if not (embedded_model_path() / "config.json").exists():
        pytest.skip("the embedded model has not been built")
    run = tmp_path_factory.mktemp("runs") / "run"
    config = build_config(
        {"steps": 10, "eval_num_problems": 10, "output": str(run), "seed": 1, "save_every": 5},
        task_defaults=recommended_settings,
    )
    train(config)
    return run


def test_trained_run_beats_base_significantly(trained_run, tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(
        app, ["compare", "--trained", str(trained_run), "--n", "100", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["task"] == "arith" and report["n"] == 100  # the run's task, 100 of its test prompts
    assert report["models"]["base"]["model"] == "embedded" and report["models"]["base"]["adapter"] is None
    assert report["models"]["trained"]["adapter"] == str(trained_run)
    assert report["metric"] == "accuracy" and report["test"] == "mcnemar-exact"
    assert report["difference"] > 0.2 and report["ci"][0] > 0
    assert report["p_value"] < 1e-3 and report["significant"]
    assert report["wins"] > report["losses"]
    base, trained = report["models"]["base"], report["models"]["trained"]
    assert report["difference"] == pytest.approx(trained["accuracy"] - base["accuracy"])
    assert "trained is better than base" in result.output
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 100
    assert sum(r["outcome"] == "won" for r in rows) == report["wins"]
    assert (out / "report.md").read_text().count("| accuracy |") == 1
    if importlib.util.find_spec("matplotlib") is not None:  # the optional plot extra
        assert (out / "rewards.png").read_bytes()[:4] == b"\x89PNG"


def test_a_checkpoint_folder_and_an_adapter_folder_compare_too(trained_run, tmp_path):
    step = trained_run / "checkpoints" / "step_000005"
    spec = cmp.resolve_model(str(step))
    assert spec.run_dir == trained_run and spec.adapter == str(step) and spec.model is None
    assert cmp.resolve_model("embedded", str(step)).run_dir == trained_run  # eval --adapter: the run's task
    # adapters copied out of their run: the base comes from adapter_config.json
    loose = tmp_path / "adapters"
    loose.mkdir()
    for name in ("adapters.safetensors", "adapter_config.json"):
        shutil.copy(trained_run / name, loose / name)
    spec = cmp.resolve_model(str(loose))
    assert spec.run_dir is None and spec.model == str(embedded_model_path())
    assert cmp.default_base(spec).adapter is None
    task, settings = task_and_settings(None, n=20, max_tokens=48)
    report = cmp.compare(cmp.resolve_model(str(trained_run)), spec, task, settings)
    assert report.data["difference"] == 0.0  # the same weights, loaded two ways


def test_full_fine_tune_run_and_a_whole_model(tiny_model_path, tmp_path):
    run = tmp_path / "full"
    # A reward that varies between random completions, so the one step has a gradient.
    rewards = tmp_path / "rewards.py"
    rewards.write_text(
        "def bytes_sum(prompts, completions, **kw):\n"
        "    return [float(sum(c.encode()) % 5) for c in completions]\n"
    )
    train(
        build_config(
            {
                "model": str(tiny_model_path),
                "fine_tune_type": "full",
                "steps": 1,
                "batch_size": 4,
                "group_size": 4,
                "max_tokens": 4,
                "eval_num_problems": 4,
                "output": str(run),
                "lr": 1e-2,
                "task": "arith",
                "reward_file": str(rewards),
                "reward": ["bytes_sum"],
            }
        )
    )
    spec = cmp.resolve_model(str(run))
    assert spec.model == str(tiny_model_path) and spec.adapter == str(run)
    runner = CliRunner()
    result = runner.invoke(
        app, ["compare", "--trained", str(run), "--n", "6", "--output", str(tmp_path / "a")]
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["max_tokens"] == 4  # the run's setting
    # the full weights were applied: the trained model answers differently
    rows = [json.loads(line) for line in (tmp_path / "a" / "rows.jsonl").read_text().splitlines()]
    assert any(r["base"]["completions"] != r["trained"]["completions"] for r in rows)
    # a whole (e.g. fused) model has no recorded base: --base names it
    result = runner.invoke(
        app,
        [
            "compare",
            "--trained",
            str(tiny_model_path),
            "--base",
            str(tiny_model_path),
            "--n",
            "4",
            "--max-tokens",
            "4",
            "--output",
            str(tmp_path / "b"),
            "--no-plot",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "b" / "report.json").read_text())["p_value"] == 1.0
    assert not (tmp_path / "b" / "rewards.png").exists()


def test_answers_are_reused_only_while_nothing_that_decides_them_changed(
    tiny_model_path, tmp_path, monkeypatch
):
    """The second eval of the same model, prompts and settings reads the answers back instead of decoding;
    another setting, changed model files, or a damaged cache file decode again; --no-cache never reads."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_path, model)
    spec = cmp.ModelSpec(str(model))
    task, settings = task_and_settings(str(model), n=6, max_tokens=6, samples=2)
    settings.cache = True
    first = cmp.evaluate(spec, task, settings).results[0]
    assert first.cached is None
    decoded = []
    real_generate = cmp.generate
    monkeypatch.setattr(cmp, "generate", lambda *a, **k: decoded.append(1) or real_generate(*a, **k))

    again = cmp.evaluate(spec, task, settings).results[0]
    assert decoded == [] and again.cached is not None and again.cached.is_file()
    assert [a.tokens for a in again.answers] == [a.tokens for a in first.answers]
    assert again.summary()["reward"] == first.summary()["reward"]  # scored again, the same
    assert again.seconds == pytest.approx(first.seconds)  # the decode time it took then
    assert again.summary()["answers_from_cache"] == str(again.cached)

    settings.sampling.max_tokens = 5  # another setting: other answers
    assert cmp.evaluate(spec, task, settings).results[0].cached is None and decoded == [1]
    settings.sampling.max_tokens = 6
    weights = next(model.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes())  # same bytes, a new modification time: the files changed
    assert cmp.evaluate(spec, task, settings).results[0].cached is None and decoded == [1, 1]
    kept = next(iter(sorted(again.cached.parent.glob("*.json"), key=lambda p: p.stat().st_mtime)[-1:]))
    kept.write_text("{not json")  # a damaged cache file: decoded again, and written anew
    assert cmp.evaluate(spec, task, settings).results[0].cached is None and decoded == [1, 1, 1]
    assert cmp.evaluate(spec, task, settings).results[0].cached is not None and decoded == [1, 1, 1]
    settings.cache = False
    assert cmp.evaluate(spec, task, settings).results[0].cached is None and decoded == [1, 1, 1, 1]


def test_compare_says_which_answers_came_from_the_cache(tiny_model_path, tmp_path):
    args = [
        "compare",
        "--trained",
        str(tiny_model_path),
        "--base",
        str(tiny_model_path),
        "--task",
        "arith",
        "--n",
        "4",
        "--max-tokens",
        "4",
        "--no-plot",
    ]
    first = CliRunner().invoke(app, args + ["--output", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    assert first.output.count("answers from the cache") == 1  # the same model twice: decoded once
    second = CliRunner().invoke(app, args + ["--output", str(tmp_path / "b")])
    assert second.exit_code == 0, second.output
    assert second.output.count("answers from the cache") == 2
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["models"]["base"]["answers_from_cache"]
    fresh = CliRunner().invoke(app, args + ["--output", str(tmp_path / "c"), "--no-cache"])
    assert fresh.exit_code == 0 and "answers from the cache" not in fresh.output
    assert json.loads((tmp_path / "c" / "report.json").read_text())["difference"] == report["difference"]
