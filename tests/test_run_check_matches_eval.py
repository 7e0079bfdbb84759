"""A run's own before/after check answers exactly as `eval` does on the same weights and problems.

The model is a quantized GGUF file (the embedded arith model written as Q8_0 and Q4_0), the case where
the trainer samples from a float32 copy of the quantized base and `eval` loads the file again: the run's
check must read the weights a user gets and loads afterwards, not a model of its own.
"""

import pytest

from mlx_grpo.config import build_config
from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.models.export import export
from mlx_grpo.models.loading import embedded_model_path, gguf_types_note
from mlx_grpo.run.trainer import train
from mlx_grpo.sampling import heldout
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import recommended_settings

pytestmark = [
    pytest.mark.usefixtures("gguf_cache"),
    pytest.mark.skipif(
        not (embedded_model_path() / "config.json").exists(),
        reason="the embedded model has not been built (scripts/build_tiny_model.py)",
    ),
]

PROBLEMS, MAX_TOKENS = 8, 24


def eval_answers(name: str, **settings):
    """What `mlx-grpo eval --model NAME --n 8 --max-tokens 24 --split validation` (the rows a run checks
    itself on) decodes and scores: (token ids, accuracy)."""
    spec = cmp.resolve_model(name)
    config = cmp.task_config(
        spec.run_dir,
        spec.model,
        {"task": "arith", "eval_num_problems": PROBLEMS, "max_tokens": MAX_TOKENS, **settings},
    )
    report = cmp.evaluate(
        spec, load_task(config), cmp.build_settings(config, split="validation"), config.eval_num_problems
    )
    result = report.results[0]
    return [a.tokens for a in result.answers], report.data["models"]["model"]["accuracy"]


@pytest.mark.parametrize("outtype, keep_quantized", [("q8_0", False), ("q4_0", False), ("q4_0", True)])
def test_the_runs_check_answers_as_eval_does(tmp_path, monkeypatch, cpu_device, outtype, keep_quantized):
    model = str(export(None, None, gguf_path=str(tmp_path / f"arith-{outtype}.gguf"), outtype=outtype)[0])
    assert f"kept {outtype[1]}-bit" in gguf_types_note(model)  # quantized blocks, not a float file
    checks = []  # each held-out check's completions, in the order the run makes them

    def recorded(*args, **kwargs):
        completions = sampled(*args, **kwargs)
        checks.append(completions)
        return completions

    sampled = heldout.sample_completions
    monkeypatch.setattr(heldout, "sample_completions", recorded)
    run = tmp_path / "run"
    config = build_config(
        {
            "model": model,
            "task": "arith",
            "steps": 2,
            "batch_size": 2,
            "group_size": 4,
            "lr": 1e-2,
            "max_tokens": MAX_TOKENS,
            "eval_num_problems": PROBLEMS,
            "output": str(run),
            "keep_quantized": keep_quantized,
        },
        task_defaults=recommended_settings,
    )
    result = train(config)
    before, after = checks[0], checks[-1]
    assert len(checks) == 2 and len(before) == len(after) == PROBLEMS

    base_tokens, base_accuracy = eval_answers(model, keep_quantized=keep_quantized)  # as in a --config file
    trained_tokens, trained_accuracy = eval_answers(str(run))  # the run folder brings its keep_quantized
    assert [c.tokens for c in before] == base_tokens
    assert [c.tokens for c in after] == trained_tokens
    assert (result.accuracy_before, result.accuracy_after) == (base_accuracy, trained_accuracy)
