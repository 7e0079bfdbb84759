"""How well the embedded arith model does, as build_tiny_model.py measures it at the end of a build (and
writes to build_info.json): greedy accuracy, sampled accuracy and pass@k at temperature 1.0, overall and per
template; the prompts in the chat format the trainer builds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rewards import arith  # noqa: E402


def prompt_ids(tokenizer, question: str) -> list[int]:
    """The chat-formatted prompt, exactly as the trainer will build it (no system prompt)."""
    messages = [{"role": "user", "content": question}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def decode(model, prompts: list[list[int]], max_tokens: int, eos_id: int, temperature: float):
    """Complete equal-length prompts in one batch with a KV cache; greedy if temperature 0."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array(prompts), cache=cache)[:, -1, :]
    outputs = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(max_tokens):
        if temperature == 0:
            tokens = mx.argmax(logits, axis=-1)
        else:
            tokens = mx.random.categorical(logits / temperature)
        for i, t in enumerate(tokens.tolist()):
            if not done[i]:
                outputs[i].append(t)
                done[i] = t == eos_id
        if all(done):
            break
        logits = model(tokens[:, None], cache=cache)[:, -1, :]
    return outputs


def complete_all(
    model, tokenizer, problems, samples: int, max_tokens: int, eos_id: int, temperature: float
) -> list[list[str]]:
    """``samples`` completions (decoded text) per problem; prompts batched by length."""
    encoded = [prompt_ids(tokenizer, p["prompt"]) for p in problems]
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(i)
    texts: list[list[str]] = [[] for _ in problems]
    for length in sorted(by_length):
        members = [i for i in by_length[length] for _ in range(samples)]
        outputs = decode(model, [encoded[i] for i in members], max_tokens, eos_id, temperature)
        for i, out in zip(members, outputs):
            texts[i].append(tokenizer.decode(out, skip_special_tokens=True))
    return texts


def evaluate(
    model, tokenizer, problems, eos_id: int, seed: int, samples: int = 8, max_tokens: int = 40
) -> dict:
    """Greedy accuracy, sampled accuracy (T = 1.0) and pass@samples, overall and per template."""
    answers = [p["answer"] for p in problems]
    greedy = [t[0] for t in complete_all(model, tokenizer, problems, 1, max_tokens, eos_id, 0.0)]
    greedy_right = arith.correctness_reward(None, greedy, answers)
    mx.random.seed(seed)
    sampled = complete_all(model, tokenizer, problems, samples, max_tokens, eos_id, 1.0)
    sampled_right = [arith.correctness_reward(None, s, [a] * samples) for s, a in zip(sampled, answers)]

    def summary(indices):
        n = max(len(indices), 1)
        return {
            "problems": len(indices),
            "greedy_accuracy": round(sum(greedy_right[i] for i in indices) / n, 4),
            "sampled_accuracy": round(sum(sum(sampled_right[i]) / samples for i in indices) / n, 4),
            f"pass@{samples}": round(sum(max(sampled_right[i]) for i in indices) / n, 4),
        }

    result = summary(range(len(problems)))
    result["per_template"] = {
        t: summary([i for i, p in enumerate(problems) if p["template"] == t]) for t in arith.TEMPLATES
    }
    result["greedy_examples"] = [
        {"prompt": problems[i]["prompt"], "completion": greedy[i], "answer": answers[i]} for i in range(5)
    ]
    return result
