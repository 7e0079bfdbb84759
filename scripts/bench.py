"""Time a GRPO workload with mlx-grpo and, when installed, with mlx-lm-lora.

    python scripts/bench.py                       # tiny random Qwen2, 2 prompts x 4, 32 tokens, 20 steps
    python scripts/bench.py --preset qwen0.5b --group-size 8 --max-tokens 256 --steps 2 --peer off
    python scripts/bench.py --model PATH_OR_HF_ID --prompts 4 --group-size 8

Prints one JSON object: per trainer the median step, rollout and update time
(the first `--warmup` steps left out), rollout and training tokens/s, peak
memory, achieved FLOP/s and its share of a float matmul peak measured in the
same process, and the reward curve; with mlx-lm-lora installed
(`pip install -e ".[bench]"`) the same workload also runs through its GRPO
trainer, one step of each in turn, so that both see the same machine load,
and `speedup` is its median step time over ours.

The model is random (weights from a seed) unless --model is given; its
tokenizer is byte-level, padded with multi-byte tokens up to the vocabulary
size. The reward, the share of ASCII letters in a completion, is something a
random model can learn, so the reward columns show whether learning happens.

The workload and its FLOP counts are in bench_workload.py, the two trainers in
bench_trainers.py, the variants and the other patches in bench_variants.py.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from mlx_grpo.blas import blas_description, loaded_blas, use_openblas
from mlx_grpo.device import on_cpu
from mlx_grpo.models.heap import keep_freed_memory
from mlx_grpo.models.random_model import build_random_model

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
from bench_blas import gflops  # noqa: E402 (the one matmul timing loop)
from bench_trainers import Ours, Peer, summary  # noqa: E402
from bench_variants import VARIANTS, synthetic_rollouts  # noqa: E402
from bench_workload import PRESETS, dequantized_copy, model_shape, prompt_texts  # noqa: E402
from benchlib import emit_result, load_average, load_since, machine_line, markdown_table  # noqa: E402


# ---------------------------------------------------------------- the machine's own rates


def matmul_peak(dtype, sizes=(512, 1024, 2048), seconds=0.5) -> float:
    """Best FLOP/s of a square matmul of the model's dtype on the default device."""
    return 1e9 * max(gflops(n, n, n, seconds / len(sizes), dtype) for n in sizes)


def machine_limits(model, tokenizer, shape: dict, args) -> dict:
    """What this machine does at the workload's shapes: MLX's bare decode loop at the rollout's width
    (scripts/decode_ceiling.py), and the float matmul rate at an update micro-batch's MLP shape."""
    from decode_loops import bare_loop

    width = args.prompts * args.group_size
    prompt = tokenizer.encode(prompt_texts(1)[0])
    bare = bare_loop(model, prompt, width, min(args.max_tokens, 64))
    rows = min(args.micro_batch_size, width) * (len(prompt) + args.max_tokens)
    rate = gflops(rows, shape["hidden"], shape["intermediate"], 1.0)
    return {
        "decode_width": width,
        "bare_decode_step_ms": 1000 * bare,
        "bare_decode_tok_s": width / bare,
        "update_shape": [rows, shape["hidden"], shape["intermediate"]],
        "update_shape_sgemm_gflops": rate,
    }


def peer_available() -> bool:
    try:
        import mlx_lm_lora.trainer.grpo_trainer  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", help="model folder or Hugging Face id (default: a random model of --preset)")
    p.add_argument("--preset", choices=PRESETS, default="tiny", help="shape of the random model")
    p.add_argument("--dtype", default="float32", help="random model's dtype (float32, bfloat16, float16)")
    p.add_argument(
        "--dequantize",
        action="store_true",
        help="run a float32 copy of --model (quantized weights widened), made in a temporary folder",
    )
    p.add_argument(
        "--quantize",
        type=int,
        choices=(0, 4, 8),
        default=0,
        help="random model's weights quantised to 4 or 8 bits (a QLoRA base)",
    )
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-layers", type=int, default=-1)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--micro-batch-size", type=int, default=16)
    p.add_argument("--decode-concurrency", type=int, default=256)
    p.add_argument("--logprob-chunk-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-stop",
        action="store_true",
        help="equal work: both trainers decode every completion to --max-tokens (end tokens do not stop)",
    )
    p.add_argument(
        "--synthetic-rollouts",
        action="store_true",
        help="skip decoding: every completion is max_tokens random tokens (to measure the update alone)",
    )
    p.add_argument(
        "--variants",
        default="",
        help=f"comma-separated variants of ours to run alongside: {', '.join(VARIANTS)}, or all",
    )
    p.add_argument(
        "--peer",
        choices=("auto", "off", "only"),
        default="auto",
        help="also run mlx-lm-lora (auto: when installed), or only it",
    )
    p.add_argument(
        "--blas",
        choices=("auto", "stock"),
        default="auto",
        help="auto: OpenBLAS preloaded when installed on Linux, as the mlx-grpo command does; "
        "stock: the BLAS MLX came with",
    )
    p.add_argument(
        "--limits",
        action="store_true",
        help="also measure MLX's bare decode loop at the rollout's width and the matmul rate at the "
        "update's shape, and give each trainer's rollout and update as fractions of them",
    )
    p.add_argument("--out", help="also write the JSON here")
    return p.parse_args(argv)


def run(args) -> dict:
    variants = list(VARIANTS) if args.variants == "all" else [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmp:
        if args.model and args.dequantize:
            model_path = dequantized_copy(args.model, Path(tmp) / "float32")
            shape = model_shape(model_path)
        elif args.model:
            model_path, shape = args.model, model_shape(args.model)
        else:
            shape = PRESETS[args.preset]
            model_path = str(
                build_random_model(Path(tmp), **shape, seed=args.seed, dtype=args.dtype, bits=args.quantize)
            )
        texts = prompt_texts(args.prompts)
        peer_wanted = args.peer == "only" or (args.peer == "auto" and peer_available())
        if args.peer == "only" and not peer_available():
            raise SystemExit("error: --peer only needs mlx-lm-lora (pip install -e '.[bench]')")

        ours = Ours(model_path, texts, args)
        trainers = [] if args.peer == "only" else [ours]
        trainers += [Ours(model_path, texts, args, name, *VARIANTS[name]) for name in variants]
        if peer_wanted:
            from mlx_grpo.run.trainer import make_optimizer

            trainers.append(Peer(model_path, texts, args, make_optimizer(ours.config)))
        if args.peer == "only":
            del ours
        dtype = next(
            v.dtype
            for _, v in tree_flatten(trainers[0].model.parameters())
            if mx.issubdtype(v.dtype, mx.floating)
        )
        peak = matmul_peak(dtype, sizes=(512, 1024) if on_cpu() else (2048, 4096, 8192))

        results = {t.name: [] for t in trainers}
        with synthetic_rollouts() if args.synthetic_rollouts else contextlib.nullcontext():
            for _ in range(args.steps):  # one step of each in turn: both see the same load
                for t in trainers:
                    results[t.name].append(t.step())
        limits = None
        if args.limits:  # measured after the steps, on the same model and machine load
            trainers[0].model.eval()
            limits = machine_limits(trainers[0].model, trainers[0].tokenizer, shape, args)

        prompt_tokens = (
            [len(d[0]) for d in trainers[-1].dataset]
            if peer_wanted
            else [len(ours._encode(t)) for t in texts]
        )
        out = {
            "workload": {
                "model": args.model or f"random {args.preset}",
                **shape,
                "dtype": str(dtype),
                "prompts": args.prompts,
                "group_size": args.group_size,
                "max_tokens": args.max_tokens,
                "steps": args.steps,
                "lora_rank": args.lora_rank,
                "lora_layers": args.lora_layers,
                "decode_concurrency": args.decode_concurrency,
                "micro_batch_size": args.micro_batch_size,
                "quantized_bits": args.quantize or None,
                "logprob_chunk_size": args.logprob_chunk_size,
                "synthetic_rollouts": args.synthetic_rollouts,
                "no_stop": args.no_stop,
                "prompt_tokens": prompt_tokens,
            },
            "device": str(mx.default_device()),
            "machine": machine_line(),
            # 1, 5 and 15-minute load averages at the start and end (a shared machine: other work slows both)
            "load_average": load_since(load_start),
            "blas": loaded_blas(),
            "blas_kernels": blas_description(),  # the kernels every figure here ran on
            "matmul_peak_gflops": peak / 1e9,
        }
        for name, steps in results.items():
            out[name] = summary(
                steps,
                args.warmup,
                shape,
                args.group_size,
                2.0,
                peak,
                decoded=not (args.synthetic_rollouts and name != "mlx_lm_lora"),
            )
            if limits:  # each trainer as a fraction of what the machine does at its shapes
                out[name]["rollout_frac_of_bare_decode"] = (
                    out[name]["rollout_tokens_per_s"] / limits["bare_decode_tok_s"]
                )
                out[name]["update_frac_of_sgemm"] = (
                    out[name]["update_gflops"] / limits["update_shape_sgemm_gflops"]
                )
        if limits:
            out["limits"] = limits
        if "mlx_grpo" in out and "mlx_lm_lora" in out:
            ours, peer = out["mlx_grpo"], out["mlx_lm_lora"]
            out["speedup"] = peer["step_s"] / ours["step_s"]
            # Step times compare equal work only when the completions are about as long.
            out["speedup_per_token"] = peer["step_s_per_1k_tokens"] / ours["step_s_per_1k_tokens"]
            out["update_speedup_per_token"] = ours["train_tokens_per_s"] / peer["train_tokens_per_s"]
            out["completion_length_ratio"] = peer["mean_completion_tokens"] / ours["mean_completion_tokens"]
            out["memory_ratio"] = ours["peak_memory_gb"] / peer["peak_memory_gb"]
        for name in variants:  # how much slower ours gets without each measure
            out[name]["step_s_vs_ours"] = out[name]["step_s"] / out["mlx_grpo"]["step_s"]
    return out


TABLE_COLUMNS = [  # (heading, key in a trainer's summary, format)
    ("step s", "step_s", ".2f"),
    ("rollout s", "rollout_s", ".2f"),
    ("update s", "update_s", ".2f"),
    ("tokens/completion", "mean_completion_tokens", ".1f"),
    ("step s / 1k tokens", "step_s_per_1k_tokens", ".2f"),
    ("rollout tok/s", "rollout_tokens_per_s", ".0f"),
    ("update tok/s", "train_tokens_per_s", ".0f"),
    ("peak GB", "peak_memory_gb", ".2f"),
    ("rollout / update peak GB", None, None),
]


def table(out: dict) -> str:
    """The trainers' figures as a Markdown table."""
    rows = [
        [name]
        + [
            format(figures[key], fmt)
            if key
            else f"{figures['rollout_peak_memory_gb']:.2f} / {figures['update_peak_memory_gb']:.2f}"
            for _, key, fmt in TABLE_COLUMNS
        ]
        for name, figures in out.items()
        if isinstance(figures, dict) and "step_s" in figures
    ]
    return markdown_table(["trainer"] + [h for h, _, _ in TABLE_COLUMNS], rows)


def main(argv=None):
    args = parse_args(argv)
    if args.blas == "auto" and argv is None:
        use_openblas()  # re-executes this script with OpenBLAS preloaded, when there is one
        keep_freed_memory()  # as the mlx-grpo command does (models/heap.py)
    out = run(args)
    emit_result(out, args.out, table(out))


if __name__ == "__main__":
    main()
