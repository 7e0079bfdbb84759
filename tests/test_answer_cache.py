"""Answers kept between eval and compare runs (evaluation/answer_cache.py) belong to the code that made them:
another mlx-grpo version or decode format decodes again, and a reuse says which version made the answers.
A multi-turn task's episodes are kept under everything that played them, and reused as they were played."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import mlx_grpo
from mlx_grpo import version
from mlx_grpo.cli import app
from mlx_grpo.evaluation import answer_cache
from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.evaluation import compare_report as cmp_report
from mlx_grpo.sampling import progress, rollout
from mlx_grpo.run.task_setup import load_task


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


def test_a_change_to_the_code_that_renders_or_decodes_is_another_key(tiny_model_path, monkeypatch):
    """DECODE_FORMAT is bumped by hand; the source of the code between a row and its answers (ANSWER_CODE) is
    in the key too, so an edit to it (here to encode_prompt) decodes again where nobody bumped the format."""
    spec = cmp.ModelSpec(str(tiny_model_path))
    task, settings = _task_and_settings(str(tiny_model_path))
    rows = cmp.select_rows(task, "test", 4)
    key = answer_cache.cache_key(spec, task, rows, settings)
    read = answer_cache.code_text
    names = dict(answer_cache.ANSWER_CODE)["mlx_grpo.tasks.data"]
    assert "add_generation_prompt=True" in read("mlx_grpo.tasks.data", names)

    def edited(module, names):
        return read(module, names).replace("add_generation_prompt=True", "add_generation_prompt=False")

    monkeypatch.setattr(answer_cache, "code_text", edited)
    assert answer_cache.cache_key(spec, task, rows, settings) != key
    monkeypatch.setattr(answer_cache, "code_text", read)
    assert answer_cache.cache_key(spec, task, rows, settings) == key  # the same code: the same key


def test_the_code_hash_follows_the_named_code_and_nothing_else(tmp_path, monkeypatch):
    """A module's named functions and methods count, its other code does not; a name it no longer defines is
    refused, not left out of the key."""
    module = tmp_path / "answer_code_probe.py"
    module.write_text(
        "def framed(p):\n    return f'Q: {p}'\n\n\nclass Loop:\n    def step(self):\n        return 1\n\n"
        "    def log(self):\n        return 0\n\n\ndef unrelated():\n    return 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(answer_cache, "ANSWER_CODE", (("answer_code_probe", ("framed", "Loop.step")),))
    first = answer_cache.answer_code()
    module.write_text(module.read_text().replace("return 0", "return 2"))  # Loop.log and unrelated
    assert answer_cache.answer_code() == first
    module.write_text(module.read_text().replace("return 1", "return 3"))  # Loop.step
    second = answer_cache.answer_code()
    assert second != first
    module.write_text(module.read_text().replace("'Q: {p}'", "'Question: {p}'"))  # framed
    assert answer_cache.answer_code() not in (first, second)

    monkeypatch.setattr(answer_cache, "ANSWER_CODE", (("answer_code_probe", None),))  # the whole module
    whole = answer_cache.answer_code()
    module.write_text(module.read_text().replace("return 2", "return 4"))
    assert answer_cache.answer_code() != whole

    monkeypatch.setattr(answer_cache, "ANSWER_CODE", (("answer_code_probe", ("Loop.run",)),))
    with pytest.raises(LookupError, match="defines no Loop.run"):
        answer_cache.answer_code()


def test_every_piece_of_the_answer_code_is_found():
    """Each name ANSWER_CODE gives is still defined where it says (a rename must be followed there)."""
    for module, names in answer_cache.ANSWER_CODE:
        text = answer_cache.code_text(module, names)
        assert all(f"def {name.split('.')[-1]}(" in text or f"class {name}" in text for name in names or ())


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
    args = [
        "compare",
        "--trained",
        str(tiny_model_path),
        "--base",
        str(tiny_model_path),
        "--task",
        "arith",
        "--n",
        "3",
        "--max-tokens",
        "3",
        "--no-plot",
    ]
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
        result = CliRunner().invoke(
            app,
            [
                "compare",
                "--trained",
                str(tiny_model_path),
                "--base",
                str(tiny_model_path),
                "--task",
                "arith",
                "--n",
                "3",
                "--max-tokens",
                "3",
                "--no-plot",
                "--no-cache",
                "--output",
                str(tmp_path / "out"),
            ],
        )
        assert result.exit_code == 0, result.output
        assert progress.PROGRESS.get() is listener
    finally:
        progress.PROGRESS.reset(token)


def _web(model, n=3, **overrides):
    config = cmp.task_config(
        None, model, {"task": "web", "eval_num_problems": n, "max_tokens": 4, "max_turns": 2, **overrides}
    )
    return load_task(config), cmp.build_settings(config, cache=True)


def _written(report, folder):
    cmp_report.write_report(report, folder)
    return (
        json.loads((folder / "report.json").read_text()),
        (folder / "rows.jsonl").read_text(),
        (folder / "report.md").read_text(),
    )


def test_episodes_are_kept_and_a_reuse_reports_what_the_decode_did(tiny_model_path, tmp_path, monkeypatch):
    """A multi-turn task's second eval reads its episodes back instead of playing them, and its report
    (scores, parts, accuracies, finish reasons, transcripts, episode metrics) is the decoded one's."""
    spec = cmp.ModelSpec(str(tiny_model_path))
    task, settings = _web(str(tiny_model_path))
    first = cmp.evaluate(spec, task, settings)
    assert first.results[0].cached is None
    decoded = []
    real_generate = cmp.generate
    monkeypatch.setattr(cmp, "generate", lambda *a, **k: decoded.append(1) or real_generate(*a, **k))
    again = cmp.evaluate(spec, task, settings)
    assert decoded == [] and again.results[0].cached is not None and again.results[0].cached.is_file()

    (data, rows, md), (data2, rows2, md2) = _written(first, tmp_path / "a"), _written(again, tmp_path / "b")
    model, reused = data["models"]["model"], data2["models"]["model"]
    assert reused.pop("answers_from_cache") and reused.pop("answers_made_by")
    assert reused == model and model["episode"]["episode/turns"] >= 1 and model["reward_parts"]
    assert rows2 == rows and "> " in rows  # the transcripts, turn by turn
    differ = [(a, b) for a, b in zip(md.splitlines(), md2.splitlines()) if a != b]
    assert [a for a, _ in differ] == [f"- **model**: `{spec.label}`", f"{data['seconds']:.1f} s in all."], (
        differ
    )
    assert [a.tokens for a in again.results[0].answers] == [a.tokens for a in first.results[0].answers]


def test_what_an_episode_depends_on_is_in_its_key(tiny_model_path, tmp_path, monkeypatch):
    """The whole row (a web row's seed makes its environment), the episode limits, the task's settings and the
    environment's code each change the key: no episode played under other conditions is reused."""
    from mlx_grpo.tasks import registry

    spec = cmp.ModelSpec(str(tiny_model_path))
    task, settings = _web(str(tiny_model_path))
    rows = cmp.select_rows(task, "test", 3)
    key = answer_cache.cache_key(spec, task, rows, settings)
    assert answer_cache.cache_key(spec, task, [dict(r) for r in rows], settings) == key
    other_seed = [{**rows[0], "seed": rows[0]["seed"] + 1}, *rows[1:]]  # the same prompt, another environment
    assert other_seed[0]["prompt"] == rows[0]["prompt"]
    keys = {key, answer_cache.cache_key(spec, task, other_seed, settings)}
    for name, value in (("max_turns", 3), ("max_episode_tokens", 100)):
        keys.add(answer_cache.cache_key(spec, task, rows, replace(settings, **{name: value})))
    other_kinds = replace(
        settings.run_config, task_options=replace(settings.run_config.task_options, web_kinds=["form/2"])
    )
    keys.add(answer_cache.cache_key(spec, task, rows, replace(settings, run_config=other_kinds)))
    solved_only = replace(
        settings.run_config, task_options=replace(settings.run_config.task_options, web_reward="solved")
    )
    keys.add(answer_cache.cache_key(spec, task, rows, replace(settings, run_config=solved_only)))
    keys.add(
        answer_cache.cache_key(
            spec, task, rows, replace(settings, run_config=replace(settings.run_config, tool_timeout=1.0))
        )
    )
    assert len(keys) == 7

    package = tmp_path / "envcode" / "web_env_copy"  # the task's own package, as a copy that can be edited
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "env.py").write_text("STEP_LIMIT = 3\n")
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setitem(registry.BUILTIN_TASKS, "web", "web_env_copy")
    before = answer_cache.cache_key(spec, task, rows, settings)
    assert before != key  # another package's code
    (package / "env.py").write_text("STEP_LIMIT = 4\n")
    assert answer_cache.cache_key(spec, task, rows, settings) != before

    monkeypatch.setattr(answer_cache, "EPISODE_CODE", answer_cache.EPISODE_CODE[1:])  # mlx-grpo's turn loop
    assert answer_cache.cache_key(spec, task, rows, settings) not in (key, before)


def test_another_tasks_options_leave_an_episodes_key_as_it_was(tiny_model_path):
    """A multihop episode's key holds multihop's options and none of the web task's: a web option added or
    changed does not make every multihop answer decode again."""
    spec = cmp.ModelSpec(str(tiny_model_path))
    config = cmp.task_config(
        None, str(tiny_model_path), {"task": "multihop", "eval_num_problems": 2, "max_tokens": 4}
    )
    task, settings = load_task(config), cmp.build_settings(config, cache=True)
    rows = cmp.select_rows(task, "test", 2)
    key = answer_cache.cache_key(spec, task, rows, settings)

    def with_options(**options):
        run_config = replace(config, task_options=replace(config.task_options, **options))
        return answer_cache.cache_key(spec, task, rows, replace(settings, run_config=run_config))

    assert with_options(web_reward="solved", web_kinds=["fact/1"]) == key
    assert with_options(multihop_hops=[3]) != key


def test_a_tools_files_code_is_in_its_episodes_key(tiny_model_path, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "Capital of Norway?", "answer": "Oslo"}\n' * 4)
    (tmp_path / "rewards.py").write_text(
        "def exact(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    tools = tmp_path / "tools.py"
    tools.write_text("def lookup(title: str) -> str:\n    '''Read a page.'''\n    return 'Oslo'\n")
    config = cmp.task_config(
        None,
        str(tiny_model_path),
        {
            "task": "custom",
            "data": str(data),
            "reward": ["exact"],
            "reward_file": str(tmp_path / "rewards.py"),
            "tools": str(tools),
            "eval_num_problems": 2,
        },
    )
    task, settings = load_task(config), cmp.build_settings(config, cache=True)
    spec, rows = cmp.ModelSpec(str(tiny_model_path)), task.train_rows[:2]
    key = answer_cache.cache_key(spec, task, rows, settings)
    tools.write_text("def lookup(title: str) -> str:\n    '''Read a page.'''\n    return 'Bergen'\n")
    changed_tools = answer_cache.cache_key(spec, task, rows, settings)
    (tmp_path / "rewards.py").write_text(
        "def exact(prompts, completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    assert len({key, changed_tools, answer_cache.cache_key(spec, task, rows, settings)}) == 3


def test_episodes_without_the_runs_settings_are_not_kept(tiny_model_path):
    """Settings without the run's config cannot say what made the environments: nothing is kept or read."""
    task, settings = _web(str(tiny_model_path))
    assert answer_cache.cacheable(task, settings)
    assert not answer_cache.cacheable(task, replace(settings, run_config=None))
    arith, arith_settings = _task_and_settings(str(tiny_model_path))
    assert answer_cache.cacheable(arith, replace(arith_settings, run_config=None))  # a completion needs none


def test_damaged_kept_episodes_are_played_again(tiny_model_path, monkeypatch):
    spec = cmp.ModelSpec(str(tiny_model_path))
    task, settings = _web(str(tiny_model_path), n=2)
    first = cmp.evaluate(spec, task, settings).results[0]
    path = next(answer_cache.folder().glob("*.json"))
    decoded = []
    real_generate = cmp.generate
    monkeypatch.setattr(cmp, "generate", lambda *a, **k: decoded.append(1) or real_generate(*a, **k))
    path.write_text("{not json")
    assert cmp.evaluate(spec, task, settings).results[0].cached is None and decoded == [1]
    kept = json.loads(path.read_text())  # written anew; now an episode without its turns
    del kept["answers"][0]["turns"]
    path.write_text(json.dumps(kept))
    again = cmp.evaluate(spec, task, settings).results[0]
    assert (
        again.cached is None and decoded == [1, 1] and again.summary()["reward"] == first.summary()["reward"]
    )
    assert cmp.evaluate(spec, task, settings).results[0].cached == path and decoded == [1, 1]


def test_tool_episodes_are_kept_with_their_tool_metrics(tiny_model_path, tmp_path):
    """multihop: a reused eval reports the same tool calls, recall and answers as the one that played them."""
    config = cmp.task_config(
        None,
        str(tiny_model_path),
        {"task": "multihop", "eval_num_problems": 2, "multihop_hops": [2], "max_tokens": 4, "max_turns": 2},
    )
    task, settings = load_task(config), cmp.build_settings(config, cache=True)
    spec = cmp.ModelSpec(str(tiny_model_path))
    first, again = cmp.evaluate(spec, task, settings), cmp.evaluate(spec, task, settings)
    assert first.results[0].cached is None and again.results[0].cached is not None
    (data, rows, _), (data2, rows2, _) = _written(first, tmp_path / "a"), _written(again, tmp_path / "b")
    decoded, reused = data["models"]["model"], data2["models"]["model"]
    assert reused.pop("answers_from_cache") and reused.pop("answers_made_by")
    assert reused == decoded and "tools/calls_per_episode" in decoded["episode"] and rows2 == rows


def test_an_adapters_key_is_its_weights_not_the_files_beside_them(tiny_model_path, tmp_path):
    """A run folder gains logs and compare reports after training: the same adapter keeps its key, and so does
    a copy of the folder; new weights (even of the same size and time) or another adapter config get
    another."""
    import os
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    (run / "adapter_config.json").write_text('{"fine_tune_type": "lora"}')
    (run / "adapters.safetensors").write_bytes(b"weights")
    spec = cmp.ModelSpec(str(tiny_model_path), adapter=str(run), run_dir=run)
    task, settings = _task_and_settings(str(tiny_model_path))
    rows = cmp.select_rows(task, "test", 4)
    key = answer_cache.cache_key(spec, task, rows, settings)

    (run / "compare.log").write_text("a log written beside the adapter")
    (run / "metrics.jsonl").write_text("{}\n")
    assert answer_cache.cache_key(spec, task, rows, settings) == key

    copy = shutil.copytree(run, tmp_path / "run-copy")  # other path, other modification times
    assert answer_cache.cache_key(replace(spec, adapter=str(copy), run_dir=copy), task, rows, settings) == key

    before = (run / "adapters.safetensors").stat()
    (run / "adapters.safetensors").write_bytes(b"Weights")  # the same size, then the same time
    os.utime(run / "adapters.safetensors", ns=(before.st_atime_ns, before.st_mtime_ns))
    retrained = answer_cache.cache_key(spec, task, rows, settings)
    assert retrained != key
    (run / "adapter_config.json").write_text('{"fine_tune_type": "dora"}')
    assert answer_cache.cache_key(spec, task, rows, settings) not in (key, retrained)
