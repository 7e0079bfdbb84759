"""Where a decoder forward pass spends its time on this machine: each op of one layer at the batch's shape.

    python scripts/profile_forward.py                          # Qwen2.5-0.5B's shape, 4 rows x 256 tokens
    python scripts/profile_forward.py --preset small --rows 2 --tokens 128 --out forward.json

A random float32 model of --preset's shape (bench.py's: mlx_grpo/models/random_model.py), run with
mlx-lm's own modules. Each line is the fastest of --repeats runs, after one warm-up, of one piece
evaluated alone (mx.eval):

  forward      the whole model, logits included
  body         the decoder layers alone (no output head)
  layer        one decoder layer; attention and mlp are its two halves
  q/k/v/o, gate/up/down   the layer's linear maps, each x W^T at the batch's rows
  swiglu       mlx-lm's SiLU(gate) * up on the mlp's width
  sdpa         mx.fast.scaled_dot_product_attention, causal, at the layer's heads
  rope, norm   the rotary embedding of the queries and one RMS norm
  head         the output projection to the vocabulary; head_logsumexp its log-normaliser
  exp, multiply   one elementwise op over the mlp's width (rows x tokens x intermediate floats):
               a transcendental against a plain arithmetic op

The matmuls' GFLOP/s set against the float32 sgemm rate at the mlp's shape say how much of a
layer is matrix work at the machine's speed and how much is the rest. A table on stderr, one JSON
object on stdout (and in --out).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_blas import gflops as sgemm_gflops  # noqa: E402
from bench_workload import PRESETS  # noqa: E402
from benchlib import emit_result, run_seconds  # noqa: E402

from mlx_grpo.blas import blas_description, loaded_blas, use_openblas  # noqa: E402
from mlx_grpo.models.random_model import build_random_model  # noqa: E402


def fastest(fn, repeats: int) -> float:
    """Seconds of the fastest of `repeats` evaluated runs of fn(), after one warm-up run."""
    import mlx.core as mx

    return min(run_seconds(lambda: mx.eval(fn()), repeats))


def pieces(model, rows: int, tokens: int, shape: dict) -> dict:
    """name -> (function, matmul FLOPs or 0) for every piece the table times."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.activations import swiglu

    hidden, inter, vocab = shape["hidden"], shape["intermediate"], shape["vocab"]
    heads, kv_heads = shape["heads"], shape["kv_heads"]
    head_dim = hidden // heads
    n = rows * tokens
    ids = mx.random.randint(0, vocab, (rows, tokens))
    x = mx.random.normal((rows, tokens, hidden))
    wide = mx.random.normal((rows, tokens, inter))
    q = mx.random.normal((rows, heads, tokens, head_dim))
    kv = mx.random.normal((rows, kv_heads, tokens, head_dim))
    logits = mx.random.normal((n, vocab))
    mx.eval(ids, x, wide, q, kv, logits)
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    head = model.lm_head if hasattr(model, "lm_head") else model.model.embed_tokens.as_linear

    def linear(module, inputs, out):
        return lambda: module(inputs), 2 * n * inputs.shape[-1] * out

    per_layer = 2 * n * hidden * (2 * hidden + 2 * kv_heads * head_dim + 3 * inter)
    return {
        "forward": (lambda: model(ids), 0),
        "body": (lambda: model.model(ids), per_layer * shape["layers"]),
        "layer": (lambda: layer(x, "causal", None), per_layer),
        "attention": (lambda: attn(x, "causal", None), 0),
        "mlp": (lambda: mlp(x), 2 * n * hidden * 3 * inter),
        "q": linear(attn.q_proj, x, hidden),
        "k": linear(attn.k_proj, x, kv_heads * head_dim),
        "o": linear(attn.o_proj, x, hidden),
        "gate": linear(mlp.gate_proj, x, inter),
        "down": linear(mlp.down_proj, wide, hidden),
        "swiglu": (lambda: swiglu(wide, wide), 0),
        "sdpa": (
            lambda: mx.fast.scaled_dot_product_attention(q, kv, kv, scale=head_dim**-0.5, mask="causal"),
            4 * rows * heads * tokens * tokens * head_dim,
        ),
        "rope": (lambda: attn.rope(q), 0),
        "norm": (lambda: layer.input_layernorm(x), 0),
        "head": (lambda: head(x), 2 * n * hidden * vocab),
        "head_logsumexp": (lambda: mx.logsumexp(logits, axis=-1), 0),
        "exp": (lambda: mx.exp(wide), 0),
        "multiply": (lambda: wide * wide, 0),
        "silu": (lambda: nn.silu(wide), 0),
    }


def run(args) -> dict:
    import mlx.core as mx
    from mlx_lm import load

    shape = PRESETS[args.preset]
    folder = Path(tempfile.mkdtemp(prefix="profile-forward-"))
    build_random_model(folder, **shape)
    model, _ = load(str(folder))
    model.eval()
    mx.random.seed(0)
    parts = {}
    for name, (fn, flops) in pieces(model, args.rows, args.tokens, shape).items():
        seconds = fastest(fn, args.repeats)
        parts[name] = {
            "ms": round(seconds * 1e3, 2),
            "flops": flops,
            "gflops": round(flops / seconds / 1e9, 1) if flops else None,
        }
        print(f"  {name:16s} {seconds * 1e3:9.1f} ms", file=sys.stderr, flush=True)
    n = args.rows * args.tokens
    return {
        "preset": args.preset,
        "shape": shape,
        "rows": args.rows,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "blas": loaded_blas(),
        "blas_kernels": blas_description(),
        "sgemm_gflops": round(sgemm_gflops(n, shape["hidden"], shape["intermediate"], 1.0), 1),
        "elementwise_floats": n * shape["intermediate"],
        "parts": parts,
    }


def table(out: dict) -> str:
    layers = out["shape"]["layers"]
    lines = [
        f"{out['preset']}: {out['rows']} rows x {out['tokens']} tokens, {out['blas_kernels']}; "
        f"sgemm {out['sgemm_gflops']} GFLOP/s",
        f"{'piece':16s} {'ms':>9s} {'x layers':>9s} {'GFLOP/s':>8s}",
    ]
    for name, part in out["parts"].items():
        scaled = part["ms"] * layers if name not in ("forward", "body", "head", "head_logsumexp") else None
        lines.append(
            f"{name:16s} {part['ms']:9.1f} {'' if scaled is None else f'{scaled:9.0f}':>9s} "
            f"{part['gflops'] if part['gflops'] is not None else '':>8}"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=PRESETS, default="qwen0.5b", help="shape of the random model")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each piece (after one warm-up run)")
    p.add_argument(
        "--blas",
        choices=("auto", "stock"),
        default="auto",
        help="auto: OpenBLAS preloaded when installed on Linux, as the mlx-grpo command does",
    )
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    if args.blas == "auto" and argv is None:
        use_openblas()  # re-executes this script with OpenBLAS preloaded, when there is one
    out = run(args)
    emit_result(out, args.out, table(out), indent=1)
    return out


if __name__ == "__main__":
    main()
