"""scripts/first_tokens.py: a run's first tokens at scaled LoRA updates, and where a --guide reference is placed."""

import importlib.util
import json
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlx_grpo import make_config
from mlx_grpo.api import load_task
from mlx_grpo.models.adapters import adapters_disabled, prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.tasks.data import prompt_messages, task_prompts

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("first_tokens", ROOT / "scripts" / "first_tokens.py")
first_tokens = importlib.util.module_from_spec(spec)
spec.loader.exec_module(first_tokens)


def _trained_tiny(tiny_model_path):
    """The tiny model with LoRA on every layer and B set to random values, as after some training."""
    model, tokenizer = load_policy(str(tiny_model_path))
    prepare_for_training(model, "lora", {"rank": 4, "scale": 20.0, "dropout": 0.0})
    rng = np.random.default_rng(0)
    for _, layer in model.named_modules():
        if hasattr(layer, "lora_b"):
            layer.lora_b = mx.array(rng.normal(0, 0.02, layer.lora_b.shape).astype(np.float32))
    return model, tokenizer


def test_scaled_adapters_run_the_base_at_zero_and_the_trained_model_at_one(tiny_model_path):
    model, tokenizer = _trained_tiny(tiny_model_path)
    prompt = tokenizer.encode("Spell cat.")
    trained = np.array(first_tokens.first_token_probs(model, prompt))
    with adapters_disabled(model):
        base = np.array(first_tokens.first_token_probs(model, prompt))
    assert np.abs(trained - base).max() > 1e-3  # the adapters do change the answer

    assert first_tokens.scaled_adapters(model, 0.0) == 2 * 7  # q, k, v, o, gate, up, down in each of 2 layers
    np.testing.assert_allclose(np.array(first_tokens.first_token_probs(model, prompt)), base, atol=1e-6)
    first_tokens.scaled_adapters(model, 0.5)
    first_tokens.scaled_adapters(model, 0.5)  # from the saved scale each time, never compounded
    half = np.array(first_tokens.first_token_probs(model, prompt))
    assert np.abs(half - base).max() > 1e-4 and np.abs(half - trained).max() > 1e-4
    first_tokens.scaled_adapters(model, 1.0)
    np.testing.assert_allclose(np.array(first_tokens.first_token_probs(model, prompt)), trained, atol=1e-6)


def test_a_reference_after_the_generation_prompt_is_where_the_template_puts_an_answer(tmp_path, tiny_model_path):
    rows = [{"prompt": f"Spell {w}.", "answer": w, "reference": f"{w} is spelt {' '.join(w)}."}
            for w in ["cat", "dog", "sun", "map"] * 3]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rewards.py").write_text("def exact(prompts, completions, answer, **kwargs):\n"
                                         "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n")
    task = load_task(make_config(model=str(tiny_model_path), data=str(tmp_path / "data.jsonl"), guide=True,
                                 reward_file=str(tmp_path / "rewards.py"), reward=["exact"]))
    model, tokenizer = load_policy(str(tiny_model_path))
    row = task.train_rows[0]
    [prompt] = task_prompts(tokenizer, task, [row])

    placed = first_tokens.guide_placement(model, tokenizer, task, row, prompt)
    assert placed["same_as_template"], placed
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    assert placed["reference_start"].startswith(row["answer"])

    # Without the generation prompt the reference would follow the user's turn: the check says so.
    no_header = list(tokenizer.apply_chat_template(prompt_messages(row["prompt"], task.system_prompt),
                                                   add_generation_prompt=False, tokenize=True))
    assert not first_tokens.guide_placement(model, tokenizer, task, row, no_header)["same_as_template"]
