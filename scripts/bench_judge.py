"""What a judge model costs beside the rollout it grades: time a step, and memory.

    python scripts/bench_judge.py                                   # embedded policy and judge, arith
    python scripts/bench_judge.py --policy smollm2-135m --judge smollm2-135m --task gsm8k --max-tokens 128
    python scripts/bench_judge.py --judge smollm2-135m --keep-quantized   # the 4-bit GGUF judge as it is
    python scripts/bench_judge.py --judge smollm2-135m --bits 4     # the judge quantized to 4 bits on load

Each step the policy samples batch_size x group_size completions (rollout_s, the
trainer's time/rollout_s), then the judge grades all of them in one batched
greedy decode (judge_s, the trainer's time/judge_s; the cache is emptied each
step, so nothing is free). Memory: the judge's weights (MLX active memory before
and after loading it) and the peak while it judges above what was in use before.
Prints one line per step and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from mlx_grpo.api import load_task, make_config
from mlx_grpo.blas import blas_description, loaded_blas, use_openblas
from mlx_grpo.models.heap import keep_freed_memory
from mlx_grpo.tasks.data import columns_of
from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling.rollout import sample_completions
from mlx_grpo.tasks.data import encode_prompt
from rewards.judge import DEFAULT_MAX_TOKENS, JudgeReward, judge_prompts, load_rubric

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
from benchlib import Timer, load_average, machine_line  # noqa: E402


def weight_bytes(model) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def quantize(model, bits: int, group_size: int = 64) -> None:
    """Linear and embedding layers whose input width the group size divides, to `bits` bits."""
    nn.quantize(
        model,
        group_size=group_size,
        bits=bits,
        class_predicate=lambda _, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % group_size == 0,
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="embedded")
    parser.add_argument("--judge", default="embedded")
    parser.add_argument("--rubric", default=None, help="rubric file or built-in name; default: general")
    parser.add_argument("--task", default="arith")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="policy completion limit; default: the task's"
    )
    parser.add_argument("--judge-max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument(
        "--bits", type=int, default=0, help="quantize the judge to this many bits (0: as loaded)"
    )
    parser.add_argument(
        "--keep-quantized",
        action="store_true",
        help="keep a quantized judge quantized on the CPU (default: a float32 copy when it fits)",
    )
    args = parser.parse_args(argv)
    if argv is None:
        # re-executes this script with OpenBLAS preloaded, when there is one (as mlx-grpo does)
        use_openblas()
        keep_freed_memory()  # as the mlx-grpo command does (models/heap.py)

    settings = {"task": args.task, "batch_size": args.batch_size, "group_size": args.group_size}
    if args.policy != "embedded":
        settings["model"] = args.policy
    if args.max_tokens:
        settings["max_tokens"] = args.max_tokens
    config = make_config(**settings)
    task = load_task(config)
    policy, tokenizer = load_policy(config.model)
    policy.eval()

    mx.eval(policy.parameters())
    before = mx.get_active_memory()
    judge_model, judge_tokenizer = load_policy(args.judge, keep_quantized=args.keep_quantized)
    if args.bits:
        quantize(judge_model, args.bits)
    mx.eval(judge_model.parameters())
    judge_loaded = mx.get_active_memory() - before
    judge = JudgeReward(
        judge_model,
        judge_tokenizer,
        load_rubric(args.rubric),
        args.judge_max_tokens,
        config.decode_concurrency,
    )

    sampling = config.sampling
    steps = []
    for step in range(args.steps):
        rows = task.train_rows[step * args.batch_size : (step + 1) * args.batch_size]
        with Timer() as timer:
            completions = sample_completions(
                policy,
                tokenizer,
                [encode_prompt(tokenizer, r["prompt"], task.system_prompt) for r in rows],
                args.group_size,
                sampling,
                config.decode_concurrency,
                seed=step,
            )
        rollout_s = timer.seconds
        judge.answers.clear()
        in_use = mx.get_active_memory()
        mx.reset_peak_memory()
        prompts, texts, columns = (
            [r["prompt"] for r in rows for _ in range(args.group_size)],
            [c.text for c in completions],
            columns_of(rows, args.group_size),
        )
        scores = judge(prompts, texts, **columns)
        metrics = judge.pop_metrics()
        steps.append(
            {
                "step": step + 1,
                "rollout_s": rollout_s,
                "judge_s": metrics["time/judge_s"],
                "judge_over_rollout": metrics["time/judge_s"] / rollout_s,
                "completion_tokens": int(sum(len(c.tokens) for c in completions)),
                "judge_prompt_tokens": float(
                    np.mean(
                        [
                            len(encode_prompt(judge_tokenizer, t))
                            for t in judge_prompts(judge.rubric, prompts, texts, columns)
                        ]
                    )
                ),
                "unreadable_frac": metrics["judge/unreadable_frac"],
                "mean_score": mean_or_none([s for s in scores if s is not None]),
                "judge_peak_extra_gb": (mx.get_peak_memory() - in_use) / 1e9,
            }
        )
        print(json.dumps(steps[-1]), flush=True)
    timed = steps[1:] or steps  # the first step compiles the decode loops
    summary = {
        "policy": args.policy,
        "judge": args.judge,
        "bits": args.bits or None,
        "task": args.task,
        "keep_quantized": args.keep_quantized,
        "batch_size": args.batch_size,
        "group_size": args.group_size,
        "max_tokens": config.sampling.max_tokens,
        "judge_weights_gb": weight_bytes(judge_model) / 1e9,
        "judge_loaded_gb": judge_loaded / 1e9,
        "policy_weights_gb": weight_bytes(policy) / 1e9,
        "rollout_s": float(np.median([s["rollout_s"] for s in timed])),
        "judge_s": float(np.median([s["judge_s"] for s in timed])),
        "judge_peak_extra_gb": float(max(s["judge_peak_extra_gb"] for s in steps)),
        "machine": machine_line(),
        "blas": loaded_blas(),
        "blas_kernels": blas_description(),
        "load_average": load_average()[0],
    }
    summary["judge_over_rollout"] = summary["judge_s"] / summary["rollout_s"]
    print(json.dumps(summary))
    return summary


def mean_or_none(values: list) -> float | None:
    return float(np.mean(values)) if values else None


if __name__ == "__main__":
    main()
