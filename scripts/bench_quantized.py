"""A quantized base on the CPU: kept quantized vs the float32 copy (QLoRA, mlx_grpo/models/quantized.py).

For each way of holding the base it runs GRPO steps of the arith task (the
chat recipe's settings) and reports sampling speed (tok/s) and the update's
seconds. Then it measures what a user of the quantized model gives up when
the adapters were trained on the float32 copy: the logits of (float32 copy +
adapters) against (quantized model + adapters, as mlx-lm loads them).

    python scripts/bench_quantized.py --model smollm2-135m [--adapters RUN_DIR] [--json out.json]

Numbers from the 2-core test machine are in docs/real-models.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
from benchlib import Timer, emit_result, load_average, machine_line  # noqa: E402


def speeds(model: str, keep_quantized: bool, args) -> dict:
    import numpy as np

    from mlx_grpo.api import Trainer

    with Timer() as timer:
        trainer = Trainer(
            model=model,
            task="arith",
            keep_quantized=keep_quantized,
            steps=args.steps + 1,
            batch_size=args.batch_size,
            group_size=args.group_size,
            max_tokens=args.max_tokens,
            eval_num_problems=1,
            seed=args.seed,
        )
    load_s = timer.seconds
    history = [trainer.step() for _ in range(args.steps + 1)][1:]  # the first step warms up
    return {
        "kept_quantized": keep_quantized,
        "load_s": load_s,
        "sampling_tokens_per_s": float(np.mean([m["tokens_per_s"] for m in history])),
        "update_s": float(np.mean([m["time/update_s"] for m in history])),
        "step_s": float(np.mean([m["time/step_s"] for m in history])),
        "sequences": args.batch_size * args.group_size,
        "mean_length": float(np.mean([m["completion/mean_length"] for m in history])),
    }


def logit_difference(model: str, adapters: str | None, seed: int) -> dict:
    """(float32 copy + adapters) against (quantized + adapters) on a chat prompt."""
    import mlx.core as mx
    import numpy as np

    from mlx_grpo.models.adapters import prepare_for_training, save_adapters
    from mlx_grpo.models.loading import load_policy
    from mlx_grpo.tasks.data import encode_prompt

    if adapters is None:  # random adapters of the size training gives them
        import tempfile

        mx.random.seed(seed)
        policy, _ = load_policy(model)
        config = prepare_for_training(policy, "lora", {"rank": 8, "scale": 20.0})
        policy.update(mlx_tree_random_b(policy))
        adapters = tempfile.mkdtemp(prefix="bench-adapters-")
        save_adapters(policy, Path(adapters), {**config, "model": model})
    floats, tokenizer = load_policy(model, adapters)
    kept, _ = load_policy(model, adapters, keep_quantized=True)
    prompt = encode_prompt(
        tokenizer,
        "Tom has 7 apples. He gives 3 to a friend. How many apples does he have left?",
        "Answer with only the final number.",
    )
    tokens = mx.array([prompt + tokenizer.encode(" 4 apples. That leaves 4.", add_special_tokens=False)])
    a, b = np.array(floats(tokens)[0], dtype=np.float64), np.array(kept(tokens)[0], dtype=np.float64)
    log_a, log_b = _log_softmax(a), _log_softmax(b)
    p_a = np.exp(log_a)
    return {
        "adapters": adapters,
        "positions": int(a.shape[0]),
        "max_abs_logit_difference": float(np.abs(a - b).max()),
        "mean_abs_logit_difference": float(np.abs(a - b).mean()),
        "logit_scale_std": float(a.std()),
        "mean_kl_float_to_quantized": float((p_a * (log_a - log_b)).sum(-1).mean()),
        "argmax_agreement": float((a.argmax(-1) == b.argmax(-1)).mean()),
    }


def _log_softmax(x):
    import numpy as np

    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def mlx_tree_random_b(model):
    """Nonzero LoRA B matrices (training starts them at zero): a stand-in for trained adapters."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    return tree_unflatten(
        [
            (k, 0.01 * mx.random.normal(v.shape))
            for k, v in tree_flatten(model.trainable_parameters())
            if k.endswith("lora_b")
        ]
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--adapters", default=None, help="adapters to apply (a run folder); default: random ones"
    )
    parser.add_argument("--steps", type=int, default=2, help="timed steps (after one warm-up step)")
    parser.add_argument("--batch-size", type=int, default=6)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-quantized", action="store_true", help="only the float32 copy (the slow part)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from mlx_grpo.blas import use_openblas

    use_openblas()
    results = {
        "model": args.model,
        "machine": machine_line(),
        "load_average": load_average(),
        "float32_copy": speeds(args.model, False, args),
    }
    print(json.dumps(results["float32_copy"]), flush=True)
    if not args.skip_quantized:
        results["kept_quantized"] = speeds(args.model, True, args)
        print(json.dumps(results["kept_quantized"]), flush=True)
    results["logits"] = logit_difference(args.model, args.adapters, args.seed)
    results["load_average_after"] = load_average()
    emit_result(results, args.json, indent=1)


if __name__ == "__main__":
    main()
