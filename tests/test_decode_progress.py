"""A single-turn decode says where it is: completions done, tokens/s, the most time left
(sampling/progress.py)."""

import re

import pytest

from mlx_grpo.models.loading import load_policy
from mlx_grpo.run import display
from mlx_grpo.sampling import progress
from mlx_grpo.sampling.rollout import SamplingConfig, sample_completions
from mlx_grpo.tasks.data import encode_prompt


@pytest.mark.parametrize("concurrency", [256, 5])  # one wave, and three
def test_a_decode_reports_its_rows_and_tokens_over_its_waves(tiny_model_path, monkeypatch, concurrency):
    monkeypatch.setattr(progress, "_EVERY_S", 0.0)  # every step
    model, tokenizer = load_policy(str(tiny_model_path))
    prompts = [encode_prompt(tokenizer, q) for q in ("what is 2+3?", "add 17 and 5", "hi")]
    states = []
    token = progress.PROGRESS.set(states.append)
    try:
        out = sample_completions(
            model,
            tokenizer,
            prompts,
            4,
            SamplingConfig(temperature=1.0, max_tokens=9),
            concurrency=concurrency,
            seed=3,
        )
    finally:
        progress.PROGRESS.reset(token)
    assert states and all(s["kind"] == "decode" and s["rows"] == 12 and s["max_tokens"] == 9 for s in states)
    done = [s["done"] for s in states]
    tokens = [s["tokens"] for s in states]
    assert done == sorted(done) and tokens == sorted(tokens)  # never backwards, across waves too
    assert done[-1] == 12 and tokens[-1] == sum(len(c.tokens) for c in out)
    assert states[-1]["at_most_left_s"] == 0 and all(s["at_most_left_s"] >= 0 for s in states)
    if concurrency == 5:  # a later wave's first report still counts the waves before it
        assert any(0 < s["done"] < 12 and s["position"] == 1 for s in states[1:])


def test_nothing_listens_nothing_is_measured(tiny_model_path):
    """Without a listener no meter is made (the trainer's rollouts outside a display pay nothing)."""
    model, tokenizer = load_policy(str(tiny_model_path))
    assert progress.PROGRESS.get() is None
    sample_completions(
        model, tokenizer, [encode_prompt(tokenizer, "hi")], 2, SamplingConfig(max_tokens=4), seed=1
    )


def test_the_line_a_person_reads():
    line = display.rollout_line(
        {
            "kind": "decode",
            "rows": 32,
            "done": 20,
            "tokens": 2000,
            "position": 150,
            "max_tokens": 384,
            "seconds": 100.0,
            "tokens_per_s": 20.0,
            "at_most_left_s": 156.0,
        }
    )
    assert line == "20 of 32 completions done, token 150/384, 20 tok/s, at most 2m36s left"


def test_eval_of_a_single_turn_task_shows_its_decode_in_a_log(tiny_model_path, monkeypatch):
    """`eval` in a log (not a terminal): lines with completions done and tok/s, not silence."""
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    monkeypatch.setattr(display, "LOG_ROLLOUT_EVERY_S", 0.0)
    monkeypatch.setattr(progress, "_EVERY_S", 0.0)
    result = CliRunner().invoke(
        app, ["eval", "--model", str(tiny_model_path), "--task", "arith", "--n", "6", "--max-tokens", "6"]
    )
    assert result.exit_code == 0, result.output
    lines = re.findall(
        r"model: (\d+) of (\d+) completions done, token (\d+)/6, \d+ tok/s, at most \S+ left", result.output
    )
    assert lines and lines[-1][:2] == ("6", "6"), result.output
