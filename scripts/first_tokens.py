"""The first tokens a run's model would write, before and after training, on held-out prompts.

A format collapse (every answer a bare "#### N", a code fence dropped) starts
at the answer's first token. This prints, for each of the first --n held-out
prompts of a run's task, the --top most likely first tokens of the base model
and of the trained one (the run's adapters), at temperature 1. With --guide-check
it also says whether a --guide reference is placed where the chat template puts an
assistant's answer: the prompt's tokens followed by the reference's are compared
with the template's rendering of the whole conversation.

--scales 0.1,0.5,1 also shows the model with each LoRA update scaled by those
factors. After one optimizer step from LoRA's zero-initialised B, the update is
scale * A dB to first order and Adam's first step is lr * sign(g), so a factor t
is that same step taken at t times the learning rate: how large a step the
change needed, without training again.

    python scripts/first_tokens.py RUN [--n 8] [--top 5] [--scales 0.1,1] [--guide-check]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.tuner.lora import LoRALinear

from mlx_grpo import make_config
from mlx_grpo.api import load_task
from mlx_grpo.blas import use_openblas
from mlx_grpo.models.adapters import adapters_disabled
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.guidance import reference_completion
from mlx_grpo.tasks.data import prompt_messages, task_prompts


def first_token_probs(model, prompt_tokens: list[int]) -> mx.array:
    logits = model(mx.array([prompt_tokens]))[0, -1].astype(mx.float32)
    return mx.softmax(logits, axis=-1)


def top(tokenizer, probs: mx.array, k: int) -> list[tuple[str, float]]:
    order = mx.argsort(-probs)[:k].tolist()
    return [(tokenizer.decode([t]), round(probs[t].item(), 4)) for t in order]


def scaled_adapters(model, factor: float) -> int:
    """Every LoRA layer's contribution times `factor` (from the scale each layer was saved with); how many."""
    layers = [layer for _, layer in model.named_modules() if isinstance(layer, LoRALinear)]
    for layer in layers:
        layer.saved_scale = getattr(layer, "saved_scale", layer.scale)
        layer.scale = layer.saved_scale * factor
    return len(layers)


def guide_placement(model, tokenizer, task, row: dict, prompt_tokens: list[int]) -> dict:
    """The guided completion's tokens against the chat template's rendering of the conversation."""
    text = task.reference_answer(row)
    guided = reference_completion(model, tokenizer, task, prompt_tokens, text, 0, 1.0)
    messages = prompt_messages(row["prompt"], task.system_prompt) + [{"role": "assistant", "content": text}]
    rendered = list(tokenizer.apply_chat_template(messages, tokenize=True))
    ours = list(prompt_tokens) + list(guided.tokens)
    return {"same_as_template": rendered[:len(ours)] == ours,
            "template_after_ours": tokenizer.decode(rendered[len(ours):]),
            "reference_start": tokenizer.decode(guided.tokens[:8]),
            "prompt_end": tokenizer.decode(prompt_tokens[-6:]),
            "reference_tokens": len(guided.tokens),
            "reference_mean_logprob": round(sum(guided.logprobs) / len(guided.logprobs), 3),
            "least_likely": sorted((round(lp, 2), tokenizer.decode([t])) for t, lp in zip(guided.tokens, guided.logprobs))[:6]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder (config.yaml + adapters.safetensors)")
    parser.add_argument("--n", type=int, default=8, help="held-out prompts to look at")
    parser.add_argument("--top", type=int, default=5, help="first tokens to list per prompt")
    parser.add_argument("--scales", default="1", help="comma-separated factors on the LoRA update (1: as trained)")
    parser.add_argument("--guide-check", action="store_true", help="also check where a reference is placed")
    args = parser.parse_args()
    use_openblas()  # re-executes with OpenBLAS preloaded, as the mlx-grpo command does: 100x the wheel's BLAS

    started = time.perf_counter()
    config = make_config(str(args.run / "config.yaml"), eval_num_problems=args.n)
    task = load_task(config)
    model, tokenizer = load_policy(config.model, adapter_path=str(args.run))
    print(f"loaded in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    rows = task.eval_rows[:args.n]
    prompts = task_prompts(tokenizer, task, rows)
    scales = [float(x) for x in args.scales.split(",")]
    if scales != [1.0] and not scaled_adapters(model, 1.0):
        sys.exit(f"--scales needs LoRA adapters; {args.run} has none (DoRA and full fine-tuning scale differently)")
    for row, prompt in zip(rows, prompts):
        with adapters_disabled(model):
            line = {"prompt": row["prompt"][:60], "base": top(tokenizer, first_token_probs(model, prompt), args.top)}
        for factor in scales:
            scaled_adapters(model, factor)
            line["trained" if factor == 1 else f"trained x{factor:g}"] = top(
                tokenizer, first_token_probs(model, prompt), args.top)
        scaled_adapters(model, 1.0)
        print(json.dumps(line, ensure_ascii=False), flush=True)
    if args.guide_check:
        train_rows = task.train_rows[:2]
        with adapters_disabled(model):
            for row, prompt in zip(train_rows, task_prompts(tokenizer, task, train_rows)):
                print(json.dumps(guide_placement(model, tokenizer, task, row, prompt), ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
