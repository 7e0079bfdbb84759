"""Take one GRPO update apart: where its seconds go, against the machine's float32 matmul rate.

    python scripts/profile_update.py               # random Qwen2.5-0.5B shape, 1 prompt x 8 x 64 tokens
    python scripts/profile_update.py --model FILE.gguf --dequantize --repeats 3 --json profile.json

The batch is synthetic: --prompts prompts of --prompt-tokens random tokens, --group-size
completions of exactly --max-tokens random tokens each, random non-zero advantages, cut into
micro-batches by the trainer's own prepare_update (run/step_update.py: the CPU activation budget
picks their size, or --micro-batch N; it also picks the head's chunking). Each part is the
median of --repeats runs after one warm-up run:

  update     update/step.update as the trainer calls it: value and grad over every micro-batch
             (update/gradients.py), clipping, the optimizer step; GFLOP/s counted as bench.py's
             update_gflops (bench.step_flops: the useful forward work, plus the backward through the
             head and the layers from the lowest trained one up: x 2 with adapters on every layer)
  forward    the same log-probs and entropies without a gradient (update/step._passes)
  prompt     the prompt passes as gradients.py runs them: a cut group's prompt forward once, then
             the backward through it (forward again under the gradient); a whole micro-batch's both.
             As update/gradients.py, only the layers that a trained weight changes (from the lowest
             adapted layer up, --lora-layers) take a gradient for the prompt's keys and values
  head       the output head's log-softmax (logprobs._project, chunked as the trainer chunks)
             forward and backward, on random hidden states of the completions' shape
  body       the layers over the completion positions, forward and backward (to the LoRA weights
             and the prompt's keys and values) of a plain sum of the final hidden states
  matmuls    the body's dense matmuls alone, on the model's own weights: per layer and linear,
             x W^T forward and dY W backward (the weights are frozen: no weight gradient)
  lora       the adapters' rank-r matmuls alone: six per adapted linear
  attention  mx.fast.scaled_dot_product_attention forward and backward at the body's shapes and
             the shared prompt's mask, once per layer
  sgemm      (rows x hidden) @ (hidden x intermediate) for 1 s, at bench.py --limits' rows (what
             the update was measured against) and at a micro-batch's own body rows

Shares are of `update`. prompt + head + body split the update's work; `everything else` is the
rest of it (gradient sums, clipping, the optimizer, glue). matmuls + lora + attention lie inside
body; `body other` is the rest of body (norms, RoPE, SiLU, the shared keys' repeat and concatenation,
the adapters' adds). `forward` is for scale, in neither sum. Parts timed apart need not add up to the
whole (warm caches, allocations): a small negative remainder means the split overcounts a little.
A table on stderr, one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

from bench_blas import gflops as sgemm_gflops  # noqa: E402 (float32 GFLOP/s, as bench.py --limits measures it)
from bench_variants import replaced  # noqa: E402
from bench_workload import PRESETS, dequantized_copy, model_shape, step_flops  # noqa: E402
from benchlib import emit_result, load_average, load_since, markdown_table, run_seconds  # noqa: E402
from update_workload import (  # noqa: E402 (the synthetic batch, the model's linears)
    adapted_linears,
    completion_cache,
    matmul_flops,
    synthetic_update,
)

from mlx_grpo.blas import blas_description, use_openblas  # noqa: E402
from mlx_grpo.models.heap import keep_freed_memory
from mlx_grpo.models.adapters import prepare_for_training  # noqa: E402
from mlx_grpo.models.heads import output_head  # noqa: E402
from mlx_grpo.models.loading import load_policy  # noqa: E402
from mlx_grpo.models.random_model import build_random_model  # noqa: E402
from mlx_grpo.run.step_update import update_settings  # noqa: E402
from mlx_grpo.run.trainer import make_optimizer  # noqa: E402
from mlx_grpo.update import batch, gradients, step  # noqa: E402
from mlx_grpo.update.logprobs import SharedPromptCache, _project, prompt_pass  # noqa: E402


def timed(fn, repeats: int) -> float:
    """Median seconds of fn() (which evaluates what it builds) over `repeats`, after one warm-up run."""
    return statistics.median(run_seconds(lambda: (fn(), mx.synchronize()), repeats))


# ---------------------------------------------------------------- the parts


def profile(model, config, prep, shape: dict, args) -> dict:
    head = output_head(model)
    if head is None:
        raise SystemExit(f"error: {model.model_type} has no plain output head to time apart")
    parts, chunk, temperature = prep.parts, prep.chunk, config.sampling.temperature
    settings, optimizer = update_settings(config), make_optimizer(config)
    runs = batch.prompt_runs(parts)
    flat = lambda mb: gradients._flat_state(prompt_pass(model, mb.prompts, mb.left_padding))  # noqa: E731
    prompt_states = {run[0]: flat(parts[run[0]]) for run in runs}  # outside every timing
    mx.eval(prompt_states)
    state_of = {i: prompt_states[run[0]] for run in runs for i in run}
    # As gradients.py: only the prompt state that trained weights change carries a gradient
    lowest = gradients.lowest_trained_layer(model)
    varying = gradients._varying(len(next(iter(prompt_states.values()))), lowest)
    cotangents = {
        i: [mx.ones(state[j].shape, state[j].dtype) for j in varying] for i, state in prompt_states.items()
    }
    body_rows = [mb.completions.shape[0] * (mb.completions.shape[1] - 1) for mb in parts]
    layers = adapted_linears(model)
    dtype = layers[0][0][0].dtype  # random stand-ins for activations are of the model's own dtype

    def whole_update():
        step.update(model, optimizer, settings, prep.sizes, parts, None, chunk)

    def forward_only():
        for _ in step._passes(model, parts, temperature, chunk):
            pass

    def prompt_work():
        for run in runs:
            first = parts[run[0]]
            if len(run) > 1:  # a cut group: the prompt's forward, then the backward through it at the end
                mx.eval(flat(first))

            def through(model, first=first, cot=cotangents[run[0]]):
                state = flat(first)
                return sum((state[j] * g).sum() for j, g in zip(varying, cot))

            mx.eval(nn.value_and_grad(model, through)(model))

    hidden = [mx.random.normal((*mb.completions.shape, shape["hidden"]), dtype) for mb in parts]

    def head_work():
        for mb, h in zip(parts, hidden):

            def f(h, mb=mb):  # the entropy is evaluated too, as the loss's statistics are
                logp, entropy = _project(head, h, mb.completions, temperature, chunk, differentiated=True)
                return logp.sum(), entropy

            mx.eval(mx.value_and_grad(f)(h))

    def body_work():
        params = model.trainable_parameters()
        for i, mb in enumerate(parts):
            if mb.completions.shape[1] < 2:
                continue

            def f(params, varying_state, mb=mb, state=state_of[i]):
                model.update(params)
                flat = gradients._with_varying(state, varying, varying_state)
                return model.model(
                    mb.completions[:, :-1], cache=completion_cache(gradients._state_of(flat), mb)
                ).sum()

            mx.eval(mx.value_and_grad(f, argnums=(0, 1))(params, [state_of[i][j] for j in varying]))
        model.update(params)  # the weights themselves, not the traced copies

    inputs = {}
    for m in set(body_rows):
        for dim in {d for linears in layers for w, _, _ in linears for d in w.shape}:
            inputs[m, dim] = mx.random.normal((m, dim), dtype)
    mx.eval(inputs)

    def dense_work():
        for m in body_rows:
            for j, linears in enumerate(
                layers
            ):  # one layer's matmuls evaluated together, as a layer's graph would be
                mx.eval(
                    [inputs[m, w.shape[1]] @ w.T for w, _, _ in linears]
                    + [inputs[m, w.shape[0]] @ w for w, _, _ in linears if j >= lowest]
                )

    def lora_work():
        for m in body_rows:
            for linears in layers:
                outs = []
                for w, a, b in (x for x in linears if x[1] is not None):
                    x, g = inputs[m, w.shape[1]], inputs[m, w.shape[0]]
                    u, du = x @ a, g @ b.T
                    outs += [u @ b, u.T @ g, x.T @ du, du @ a.T]
                mx.eval(outs)

    attn = model.layers[0].self_attn
    head_dim = getattr(attn.q_proj, "linear", attn.q_proj).weight.shape[0] // attn.n_heads  # adapted or not
    attention_inputs = []
    for i, mb in enumerate(parts):
        rows, length, context = mb.completions.shape[0], mb.completions.shape[1] - 1, mb.prompts.shape[1]
        if length < 1:
            continue
        cache = SharedPromptCache(mb.left_padding, mb.group_size)
        cache.offset = context
        q = mx.random.normal((rows, attn.n_heads, length, head_dim), dtype)
        k, v = (
            mx.random.normal((rows, attn.n_kv_heads, context + length, head_dim), dtype) for _ in range(2)
        )
        attention_inputs.append((q, k, v, cache.make_mask(length), mx.ones(q.shape, dtype)))
    mx.eval([x for xs in attention_inputs for x in xs])

    def attention_work():
        for q, k, v, mask, cot in attention_inputs:

            def f(q, k, v, mask=mask):
                return mx.fast.scaled_dot_product_attention(q, k, v, scale=attn.scale, mask=mask)

            for j in range(
                len(layers)
            ):  # forward and backward from the lowest trained layer up, forward below
                mx.eval(mx.vjp(f, [q, k, v], [cot]) if j >= lowest else f(q, k, v))

    mx.reset_peak_memory()
    seconds = {"update": timed(whole_update, args.repeats)}
    peak = mx.get_peak_memory() / 1e9
    for name, fn in [
        ("forward", forward_only),
        ("prompt", prompt_work),
        ("head", head_work),
        ("body", body_work),
        ("matmuls", dense_work),
        ("lora", lora_work),
        ("attention", attention_work),
    ]:
        seconds[name] = timed(fn, args.repeats)

    h, inter = shape["hidden"], shape["intermediate"]
    reference_rows = args.sgemm_rows or min(16, args.prompts * args.group_size) * (
        args.prompt_tokens + args.max_tokens
    )
    own_rows = max(max(body_rows), 1)
    reference, own = sgemm_gflops(reference_rows, h, inter, 1.0), sgemm_gflops(own_rows, h, inter, 1.0)

    # The update's useful work: the forward over every layer and the head, and the backward (activations only)
    # through the head and the layers from the lowest trained one up: every layer's for adapters on all.
    lengths = [args.prompt_tokens] * args.prompts, [args.max_tokens] * (args.prompts * args.group_size)
    update_flops = (
        step_flops(shape, *lengths, args.group_size, 1.0)[1]
        + step_flops({**shape, "layers": shape["layers"] - lowest}, *lengths, args.group_size, 1.0)[1]
    )
    flops = dict(zip(("update", "matmuls", "lora"), (update_flops, *matmul_flops(layers, body_rows, lowest))))
    total = seconds["update"]
    table = {name: {"seconds": s, "share": s / total} for name, s in seconds.items()}
    for name, f in flops.items():
        table[name].update(flops=f, gflops=f / seconds[name] / 1e9)
    for name, whole, named in [
        ("everything_else", "update", ("prompt", "head", "body")),
        ("body_other", "body", ("matmuls", "lora", "attention")),
    ]:
        rest = seconds[whole] - sum(seconds[n] for n in named)
        table[name] = {"seconds": rest, "share": rest / total}
    return {
        "micro_batches": [list(mb.completions.shape) for mb in parts],
        "prompt_runs": len(runs),
        "logprob_chunk": chunk,
        "body_rows": body_rows,
        "update_peak_gb": peak,
        "update_tokens_per_s": args.prompts * args.group_size * args.max_tokens / total,
        "update_gflops": table["update"]["gflops"],
        "update_frac_of_sgemm": table["update"]["gflops"] / reference,
        "parts": table,
        "sgemm": {
            "reference_shape": [reference_rows, h, inter],
            "reference_gflops": reference,
            "own_shape": [own_rows, h, inter],
            "own_gflops": own,
        },
        # What the body's dense matmuls would take at the sgemm rate of their own shape: against `matmuls`,
        # how far the chained matmuls fall short of the rate; against `body`, what the rest costs.
        "matmuls_at_own_sgemm_s": flops["matmuls"] / own / 1e9,
    }


ROWS = [
    ("update", "update (value and grad over every micro-batch, clip, optimizer)"),
    ("forward", "  forward only (for scale: not in the sums)"),
    ("prompt", "  prompt passes"),
    ("head", "  head: log-softmax forward + backward"),
    ("body", "  body: layers forward + backward"),
    ("matmuls", "    dense matmuls"),
    ("lora", "    LoRA matmuls"),
    ("attention", "    attention"),
    ("body_other", "    body other"),
    ("everything_else", "  everything else"),
]


def table(out: dict) -> str:
    parts = [(label, out["parts"][key]) for key, label in ROWS]
    lines = [
        markdown_table(
            ["part", "seconds", "share of update", "GFLOP/s"],
            [
                [
                    label,
                    f"{p['seconds']:.4g}",
                    f"{100 * p['share']:.1f}%",
                    f"{p['gflops']:.1f}" if "gflops" in p else "",
                ]
                for label, p in parts
            ],
        )
    ]
    s = out["sgemm"]
    lines.append(
        f"sgemm {'x'.join(map(str, s['reference_shape']))}: {s['reference_gflops']:.1f} GFLOP/s "
        f"(update {out['update_frac_of_sgemm']:.2f}x of it); own shape {'x'.join(map(str, s['own_shape']))}: "
        f"{s['own_gflops']:.1f} GFLOP/s, the dense matmuls at that rate {out['matmuls_at_own_sgemm_s']:.4g} s"
    )
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder or GGUF file (default: a random model of --preset)")
    p.add_argument("--dequantize", action="store_true", help="run a float32 copy of --model (bench.py's)")
    p.add_argument("--preset", choices=PRESETS, default="qwen0.5b", help="shape of the random model")
    p.add_argument("--prompts", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=100, help="random tokens in each prompt")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64, help="tokens in every completion")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-layers", type=int, default=-1, help="-1: every layer")
    p.add_argument(
        "--micro-batch", type=int, help="sequences per micro-batch (default: as the trainer picks)"
    )
    p.add_argument(
        "--sgemm-rows",
        type=int,
        help="rows of the reference sgemm (default: bench.py --limits' for this workload)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each part (after one warm-up run)")
    p.add_argument(
        "--traced",
        action="store_true",
        help="run the update's pieces traced, not compiled whole (update/gradients.py COMPILE_ON_CPU)",
    )
    p.add_argument("--json", help="also write the JSON here")
    args = p.parse_args(argv)
    if argv is None:
        use_openblas()  # re-executes with OpenBLAS preloaded, as the mlx-grpo command does
        keep_freed_memory()  # as the mlx-grpo command does (models/heap.py)
    load_start = load_average()
    with (
        replaced(gradients, "COMPILE_ON_CPU", not args.traced),
        tempfile.TemporaryDirectory(prefix="profile-update-") as tmp,
    ):
        if args.model:
            path = dequantized_copy(args.model, Path(tmp) / "float32") if args.dequantize else args.model
            shape = model_shape(path)
        else:
            shape = PRESETS[args.preset]
            path = str(build_random_model(Path(tmp) / "m", **shape))
        model, _ = load_policy(path)
        mx.random.seed(0)
        prepare_for_training(
            model,
            "lora",
            {"rank": args.lora_rank, "scale": 20.0, "dropout": 0.0, "num_layers": args.lora_layers},
        )
        config, prep = synthetic_update(model, path, shape["vocab"], args)
        out = {
            "workload": {
                "model": args.model or f"random {args.preset}",
                **shape,
                "prompts": args.prompts,
                "prompt_tokens": args.prompt_tokens,
                "group_size": args.group_size,
                "max_tokens": args.max_tokens,
                "lora_rank": args.lora_rank,
                "lora_layers": args.lora_layers,
                "micro_batch": args.micro_batch,
                "repeats": args.repeats,
                "update_compiled": not args.traced,
            },
            "device": str(mx.default_device()),
            "blas_kernels": blas_description(),
            **profile(model, config, prep, shape, args),
        }
    out["load_average"] = load_since(load_start)
    emit_result(out, args.json, table(out), indent=1)
    return out


if __name__ == "__main__":
    main()
