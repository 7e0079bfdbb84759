"""One update piece, as the trainer traces it and compiled whole: seconds for the first call and after, peak.

A piece here is a prompt of 150 random tokens and one row of L completion tokens through
`completion_logprobs(..., differentiated=True)` (the frozen-head path), LoRA rank 16 on every
layer, value and gradient with respect to the adapters. Inside `value_and_grad` `mx.compile`
does not fuse (scripts/probe_compile_in_grad.py); compiling the whole `value_and_grad`, with the
model's state as its inputs and outputs, does. The first call of each new length pays the trace.

    python scripts/probe_compiled_update_piece.py --model qwen2.5-coder-0.5b-q4_k_m.gguf [--lengths 128 128 97 128]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from mlx_grpo.blas import blas_description, use_openblas


def main() -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a GGUF file, model folder or alias (quantized: run on a float32 "
                                                  "copy, as the trainer runs it)")
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 128, 97, 128])
    p.add_argument("--calls", type=int, default=3, help="calls per length and path; the first pays any trace")
    args = p.parse_args()
    use_openblas()  # re-executes with OpenBLAS preloaded, as the mlx-grpo command does
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from mlx_grpo.models.adapters import prepare_for_training
    from mlx_grpo.models.loading import load_policy
    from mlx_grpo.update.logprobs import completion_logprobs

    rows = []
    model, _ = load_policy(args.model)  # the trainer's loader: a quantized base becomes a float32 copy
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 16, "scale": 20.0, "dropout": 0.0, "num_layers": -1})

    def loss(prompt, completion):
        logp, _ = completion_logprobs(model, prompt, mx.array([0]), completion, 1, 0.8, None,
                                      differentiated=True)
        return logp.sum()

    traced = nn.value_and_grad(model, loss)
    compiled = mx.compile(traced, inputs=[model.state], outputs=[model.state])
    vocab = model.model.embed_tokens.weight.shape[0]
    prompt = mx.random.randint(0, vocab, (1, 150))
    for length in args.lengths:
        completion = mx.random.randint(0, vocab, (1, length))
        grads_of = {}
        for name, fn in (("traced", traced), ("compiled", compiled)):
            seconds = []
            mx.reset_peak_memory()
            for _ in range(args.calls):
                start = time.perf_counter()
                value, grads = fn(prompt, completion)
                mx.eval(value, grads)
                seconds.append(round(time.perf_counter() - start, 3))
            grads_of[name] = dict(tree_flatten(grads))
            rows.append({"length": length, "path": name, "seconds": seconds, "loss": float(value),
                         "peak_gb": round(mx.get_peak_memory() / 1e9, 2)})
            print(rows[-1], file=sys.stderr, flush=True)
        # The largest gradient difference, relative to that gradient's largest entry
        rows[-1]["grad_max_relative_difference"] = max(
            float(mx.abs(g - grads_of["compiled"][k]).max() / (mx.abs(g).max() + 1e-30))
            for k, g in grads_of["traced"].items())
        print("  gradients:", rows[-1]["grad_max_relative_difference"], file=sys.stderr, flush=True)
    print(json.dumps({"blas_kernels": blas_description(), "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
