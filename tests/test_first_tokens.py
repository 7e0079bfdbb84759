"""`mlx-grpo inspect RUN --first-tokens N`: the likeliest first tokens of an answer, base and trained."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from typer.testing import CliRunner

from mlx_grpo import make_config
from mlx_grpo.api import load_task
from mlx_grpo.cli import app
from mlx_grpo.evaluation.compare import CompareError
from mlx_grpo.evaluation.first_tokens import first_tokens


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_path):
    """A one-step run of a custom task, its LoRA B then set to random values, as after longer training."""
    folder = tmp_path_factory.mktemp("first-tokens")
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(40)))
    rewards = folder / "rewards.py"
    rewards.write_text(
        "def variety(prompts, completions, **kw):\n    return [len(set(c)) / 10 for c in completions]\n"
    )
    run = folder / "run"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            str(tiny_model_path),
            "--data",
            str(data),
            "--reward-file",
            str(rewards),
            "--reward",
            "variety",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--max-tokens",
            "4",
            "--eval-num-problems",
            "4",
            "--output",
            str(run),
        ],
    )
    assert result.exit_code == 0, result.output
    weights = dict(mx.load(str(run / "adapters.safetensors")))
    rng = np.random.default_rng(0)
    for name, value in weights.items():
        if name.endswith("lora_b"):
            weights[name] = mx.array(rng.normal(0, 0.05, value.shape).astype(np.float32))
    mx.save_safetensors(str(run / "adapters.safetensors"), weights)
    return run


def _oracle_top(model, tokenizer, prompt: str, k: int) -> list[tuple[str, float]]:
    """mlx-lm's own model on the chat template's rendering of the prompt: softmax of the last logits."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    logits = np.array(model(mx.array([ids]))[0, -1].astype(mx.float32), dtype=np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")[:k]
    return [(tokenizer.decode([int(t)]), float(probs[t])) for t in order]


def test_base_and_trained_first_tokens_are_the_two_models_own(run, tiny_model_path):
    found = first_tokens(run, 3, k=4)
    held_out = load_task(
        make_config(str(run / "config.yaml"))
    ).eval_rows  # the rows the run checked itself on
    assert [f.prompt for f in found] == [r["prompt"] for r in held_out[:3]]
    base = load(str(tiny_model_path))
    trained = load(str(tiny_model_path), adapter_path=str(run))
    for item in found:
        for ours, (model, tokenizer) in ((item.base, base), (item.trained, trained)):
            expected = _oracle_top(model, tokenizer, item.prompt, 4)
            assert [t for t, _ in ours] == [t for t, _ in expected]
            np.testing.assert_allclose([p for _, p in ours], [p for _, p in expected], atol=1e-5)
    assert any(item.base != item.trained for item in found)  # the adapters do move the first token


def test_the_command_prints_both_models_and_refuses_bad_input(run, tmp_path):
    result = CliRunner().invoke(app, ["inspect", str(run), "--first-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert "on 2 held-out prompts" in result.output
    assert result.output.count("    base    ") == 2 and result.output.count("    trained ") == 2
    for bad, says in ((["--first-tokens", "0"], "at least 1"), ([], None)):
        result = CliRunner().invoke(app, ["inspect", str(tmp_path / "missing"), *bad])
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert says is None or says in result.output
    with pytest.raises(CompareError, match="not a run folder"):
        first_tokens(tmp_path, 2)
