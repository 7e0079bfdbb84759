"""--prefilter K (run/prefilter.py): the base model's pass rate on each training prompt, cached; keep 0 < rate
< 1."""

import json

import numpy as np
import pytest

from mlx_grpo import make_config
from mlx_grpo.api import load_task
from mlx_grpo.config import ConfigError
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run import prefilter
from mlx_grpo.sampling.rollout import SamplingConfig
from mlx_grpo.tasks.data import DataError
from rewards.arith import correctness_reward


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "prefilter"


@pytest.fixture(scope="module")
def embedded():
    return load_policy(None, keep_quantized=True)


def test_pass_rates_are_the_share_of_right_answers_whatever_the_chunking(embedded):
    model, tokenizer = embedded
    task = load_task(make_config())
    rows = task.train_rows[:6]
    sampling = SamplingConfig(temperature=1.0, max_tokens=24)
    whole = prefilter.pass_rates(model, tokenizer, task, rows, list(range(6)), 4, sampling, concurrency=64)
    chunked = prefilter.pass_rates(model, tokenizer, task, rows, list(range(6)), 4, sampling, concurrency=8)
    np.testing.assert_array_equal(whole, chunked)  # a prompt's answers are keyed by its id, not its chunk
    assert set(whole * 4) <= {0, 1, 2, 3, 4}
    # the rate is the accuracy reward's verdict: checked by scoring the same sampled answers here
    from mlx_grpo.sampling.rollout import sample_completions
    from mlx_grpo.tasks.data import task_prompts

    answers = sample_completions(
        model,
        tokenizer,
        task_prompts(tokenizer, task, rows),
        4,
        sampling,
        64,
        seed=prefilter.SEED,
        prompt_ids=list(range(6)),
    )
    right = correctness_reward(None, [a.text for a in answers], [r["answer"] for r in rows for _ in range(4)])
    np.testing.assert_allclose(whole, np.reshape(right, (6, 4)).mean(axis=1))


def test_train_keeps_the_prompts_sometimes_solved_and_caches_their_rates(tmp_path, cache, monkeypatch):
    from mlx_grpo.run.trainer import train

    notes = []
    config = make_config(
        steps=2,
        prefilter=4,
        prefilter_prompts=40,
        eval_num_problems=4,
        save_every=100,
        output=str(tmp_path / "a"),
    )
    train(config, on_event=lambda kind, data: notes.extend(data["notes"]) if kind == "start" else None)
    (file,) = cache.glob("*.json")
    rates = np.array(json.loads(file.read_text())["pass_rates"])
    assert len(rates) == 40 and set(rates * 4) <= {0, 1, 2, 3, 4}
    assert 0 < ((rates > 0) & (rates < 1)).sum() < 40  # the tiny model solves some prompts always or never
    # the 40 prompts are the run's first 40 draws; the kept ones those with 0 < rate < 1
    rows = load_task(config).train_rows
    order = np.random.default_rng([config.seed, 0]).permutation(len(rows))[:40]
    kept = {rows[i]["prompt"] for i, r in zip(order, rates) if 0 < r < 1}
    trained = {
        json.loads(line)["prompt"] for line in (tmp_path / "a" / "completions.jsonl").read_text().splitlines()
    }
    assert trained <= kept
    (note,) = [n for n in notes if n.startswith("prefilter:")]
    assert f"kept {len(kept)} of 40" in note and "sampled in" in note

    # started again: the rates come from the cache, nothing is sampled
    monkeypatch.setattr(prefilter, "pass_rates", lambda *a, **k: pytest.fail("sampled again"))
    notes.clear()
    train(
        make_config(
            steps=1, prefilter=4, prefilter_prompts=40, eval_num_problems=4, output=str(tmp_path / "b")
        ),
        on_event=lambda kind, data: notes.extend(data["notes"]) if kind == "start" else None,
    )
    assert any("from the cache" in n for n in notes)
    # another K is another key
    with pytest.raises(pytest.fail.Exception, match="sampled again"):
        train(
            make_config(
                steps=1, prefilter=3, prefilter_prompts=40, eval_num_problems=4, output=str(tmp_path / "c")
            )
        )


def test_nothing_to_learn_is_one_clear_error(cache, embedded, monkeypatch):
    model, tokenizer = embedded
    config = make_config(prefilter=4, prefilter_prompts=5)
    task = load_task(config)
    monkeypatch.setattr(prefilter, "pass_rates", lambda *a, **k: np.array([0.0, 0.0, 1.0, 0.0, 0.0]))
    with pytest.raises(
        DataError,
        match=r"no training prompt was solved in some but not all of 4 samples "
        r"\(4 never, 1 always, of 5\)",
    ):
        prefilter.prefilter_train_rows(model, tokenizer, task, config)
    no_check = load_task(config)
    no_check.accuracy_reward = None
    with pytest.raises(ConfigError, match="needs a task with a checkable answer"):
        prefilter.prefilter_train_rows(model, tokenizer, no_check, config)


def test_its_settings_are_checked():
    for bad, message in [
        ({"prefilter": 1}, "at least 2 samples"),
        ({"prefilter": -2}, "at least 2 samples"),
        ({"prefilter_prompts": 10}, "prefilter_prompts needs --prefilter"),
        ({"prefilter": 4, "prefilter_prompts": -1}, "prefilter_prompts must be >= 0"),
    ]:
        with pytest.raises(ConfigError, match=message):
            make_config(**bad)
