"""Answers kept between eval and compare runs (evaluation/answer_cache.py) belong to the code that made them:
another mlx-grpo version or decode format decodes again, and a reuse says which version made the answers."""

import json

from typer.testing import CliRunner

import mlx_grpo
from mlx_grpo import version
from mlx_grpo.cli import app
from mlx_grpo.evaluation import answer_cache
from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.evaluation import compare_report as cmp_report
from mlx_grpo.sampling import progress, rollout
from mlx_grpo.tasks.registry import load_task


def _task_and_settings(model, n=4, max_tokens=4):
    config = cmp.task_config(None, model, {"task": "arith", "eval_num_problems": n, "max_tokens": max_tokens})
    settings = cmp.build_settings(config, cache=True)
    return load_task(config), settings


def test_the_version_is_pyprojects_as_installed():
    from importlib.metadata import version as installed

    assert mlx_grpo.__version__ == version.package_version() == installed("mlx-grpo")


def test_another_version_or_decode_format_is_another_key(tiny_model_path, monkeypatch):
    spec = cmp.ModelSpec(str(tiny_model_path))
    task, settings = _task_and_settings(str(tiny_model_path))
    rows = cmp.select_rows(task, "test", 4)
    key = answer_cache.cache_key(spec, task, rows, settings)
    assert answer_cache.cache_key(spec, task, rows, settings) == key  # nothing changed: the same key

    monkeypatch.setattr(version, "version", lambda name: "98.7.6")  # what the installed metadata says
    newer = answer_cache.cache_key(spec, task, rows, settings)
    assert newer != key
    monkeypatch.setattr(rollout, "DECODE_FORMAT", rollout.DECODE_FORMAT + 1)
    assert answer_cache.cache_key(spec, task, rows, settings) not in (key, newer)


def test_a_reuse_says_which_version_made_the_answers(tiny_model_path, monkeypatch):
    monkeypatch.setattr(version, "version", lambda name: "7.7.7")
    monkeypatch.setattr(rollout, "DECODE_FORMAT", 41)
    spec = cmp.ModelSpec(str(tiny_model_path))
    task, settings = _task_and_settings(str(tiny_model_path))
    first = cmp.evaluate(spec, task, settings, n=4)
    assert first.results[0].cached is None and first.results[0].cached_by is None
    assert "answers_made_by" not in first.data["models"]["model"]
    kept = json.loads(next(answer_cache.folder().glob("*.json")).read_text())
    assert kept["made_by"] == {"mlx_grpo": "7.7.7", "decode_format": 41}

    again = cmp.evaluate(spec, task, settings, n=4)
    made_by = "mlx-grpo 7.7.7 (decode format 41)"
    assert again.results[0].cached is not None and again.results[0].cached_by == made_by
    assert again.data["models"]["model"]["answers_made_by"] == made_by
    assert f"(reused answers made by {made_by}, from the cache)" in cmp_report.markdown(again)


def test_compare_prints_and_writes_who_made_reused_answers(tiny_model_path, tmp_path):
    args = ["compare", "--trained", str(tiny_model_path), "--base", str(tiny_model_path), "--task", "arith",
            "--n", "3", "--max-tokens", "3", "--no-plot"]
    assert CliRunner().invoke(app, args + ["--output", str(tmp_path / "a")]).exit_code == 0
    second = CliRunner().invoke(app, args + ["--output", str(tmp_path / "b")])
    assert second.exit_code == 0, second.output
    made_by = f"mlx-grpo {mlx_grpo.__version__} (decode format {rollout.DECODE_FORMAT})"
    assert second.output.count(f"reused answers made by {made_by}") == 2, second.output
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert report["models"]["base"]["answers_made_by"] == made_by
    assert (tmp_path / "b" / "report.md").read_text().count(f"reused answers made by {made_by}") == 2


def test_compare_gives_back_the_callers_progress_listener(tiny_model_path, tmp_path):
    """A notebook's own listener is still set after a compare, not replaced by nothing."""
    heard = []

    def listener(state):
        heard.append(state)

    token = progress.PROGRESS.set(listener)
    try:
        result = CliRunner().invoke(app, ["compare", "--trained", str(tiny_model_path), "--base",
                                          str(tiny_model_path), "--task", "arith", "--n", "3", "--max-tokens", "3",
                                          "--no-plot", "--no-cache", "--output", str(tmp_path / "out")])
        assert result.exit_code == 0, result.output
        assert progress.PROGRESS.get() is listener
    finally:
        progress.PROGRESS.reset(token)
