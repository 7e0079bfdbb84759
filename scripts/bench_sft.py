"""Time `mlx-grpo sft`'s step against `mlx_lm.lora`'s on equal work; print both as JSON.

    python scripts/bench_sft.py --preset smollm2 --steps 12 --warmup 2 --out sft-smollm2.json
    python scripts/bench_sft.py --preset qwen05 --steps 12 --warmup 2 --out sft-qwen05.json
    python scripts/bench_sft.py --model ~/models/qwen2.5-coder-0.5b-q4_k_m.gguf --dequantize --steps 12

Both trainers get the same model (random weights of --preset's shape from the seed, or --model), the
same JSONL rows (prompt and completion of fixed token lengths, written here), the same LoRA rank,
scale and layers, batch size, learning rate and steps, with the prompt masked out of the loss (sft
always; mlx_lm.lora with --mask-prompt). Each runs in its own process (bench_sft_sides.py), one
after the other, so that its peak memory (MLX's peak and the process's resident maximum) is its own;
the first --warmup steps (mlx_lm.lora's compilation, the first allocations) are left out of the
medians.

Equal work, and where the two still differ (so that a figure is read right):
- rows: the same tokens on both sides (checked: the row lengths each side encoded are compared);
  tokens/s counts them as sft does (every row token; trained: the completion and its end token);
- padding: sft pads a micro-batch to its longest row; mlx_lm.lora to one past a multiple of 32 (its
  last target). The default lengths make rows of 256 tokens with the random model's template, so
  that mlx_lm.lora pads one column only and both run 255-256 positions a row;
- optimizer: both AdamW, weight decay 0, one update a step; sft also clips the gradient norm and
  follows its cosine schedule, mlx_lm.lora runs a constant rate without clipping;
- mlx_lm.lora compiles its whole step (mx.compile); sft runs it eagerly;
- the process: sft's side runs as the `mlx-grpo` command does (OpenBLAS preloaded, freed memory kept
  by malloc: more resident memory, not more MLX memory); mlx_lm.lora's side gets the same BLAS
  (--blas auto) and nothing else.

A step's seconds are measured end to end, from one step's end to the next (data, forward, backward,
optimizer); each trainer's own figure (mlx_lm.lora's excludes its batch iterator) is kept beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mlx_grpo.models.random_model import build_random_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
from bench_workload import PRESETS as BENCH_PRESETS, dequantized_copy, model_shape  # noqa: E402
from bench_sft_sides import side_main  # noqa: E402 (one side, in its own process)
from benchlib import command_output, emit_result, load_average, load_since, machine, markdown_table  # noqa: E402

PRESETS = {
    "tiny": BENCH_PRESETS["tiny"],
    "qwen05": BENCH_PRESETS["qwen0.5b"],  # Qwen2.5-0.5B's shape
    # SmolLM2-135M's shape (a Llama: no attention biases)
    "smollm2": dict(
        hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152, model_type="llama"
    ),
}
GOAL_SPEEDUP = 1.5  # tokens/s against mlx_lm.lora's, at no more peak memory than its own
SIDES = ("mlx_grpo", "mlx_lm_lora")


# ---------------------------------------------------------------- the workload


def fixed_length_text(tokenizer, n: int, rng) -> str:
    """Random lowercase words that encode to `n` tokens (exactly, for a byte-level tokenizer)."""
    words = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < n:
        words.append("".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), int(rng.integers(2, 9)))))
    text = " ".join(words)
    while len(tokenizer.encode(text, add_special_tokens=False)) > n:
        text = text[:-1]
    return text


def write_rows(
    folder: Path, tokenizer, rows: int, prompt_tokens: int, completion_tokens: int, seed: int
) -> Path:
    """train.jsonl of prompt/completion rows, mlx_lm.lora's completions format, which sft reads too."""
    import numpy as np

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w", encoding="utf-8") as f:
        for _ in range(rows):
            row = {
                "prompt": fixed_length_text(tokenizer, prompt_tokens, rng),
                "completion": fixed_length_text(tokenizer, completion_tokens, rng),
            }
            f.write(json.dumps(row) + "\n")
    return folder


# ---------------------------------------------------------------- the parent


def peer_problem() -> str | None:
    """Why mlx_lm.lora cannot run here, or None."""
    try:
        import mlx_lm.lora  # noqa: F401
        import mlx_lm.tuner.trainer  # noqa: F401
    except Exception as e:  # not installed, or an mlx-lm too old or too new for this driver
        return f"mlx_lm.lora cannot be imported ({type(e).__name__}: {e})"
    return None


def run_side(side: str, spec_path: Path, folder: Path, blas: str, script: str = __file__) -> dict:
    result = folder / f"{side}.json"
    command = [
        sys.executable,
        str(Path(script).resolve()),
        "--side",
        side,
        "--spec",
        str(spec_path),
        "--result",
        str(result),
        "--blas",
        blas,
    ]
    load = load_average()
    done = subprocess.run(command, capture_output=True, text=True, cwd=str(ROOT))
    if done.returncode != 0 or not result.is_file():
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SystemExit(f"error: the {side} side failed (exit {done.returncode}):\n{tail}")
    out = json.loads(result.read_text())
    out["load_average"] = load_since(load)
    return out


def summary(result: dict, warmup: int, counts: dict) -> dict:
    """Medians over the steps after the warm-up; tokens/s on the rows' common count (`counts`)."""
    timed = result["steps"][warmup:]
    wall = statistics.median(s["wall_s"] for s in timed)
    out = {
        "steps_timed": len(timed),
        "step_s": wall,
        "own_step_s": statistics.median(s["own_step_s"] for s in timed),
        "tokens_per_s": counts["tokens"] / wall,
        "trained_tokens_per_s": counts["trained_tokens"] / wall,
        "padded_tokens_per_step": timed[0]["padded_tokens"],
        "padding_share": 1 - counts["tokens"] / timed[0]["padded_tokens"],
        "peak_memory_gb": result["peak_memory_gb"],
        "rss_peak_gb": result["rss_peak_gb"],
        "load_peak_memory_gb": result["load_peak"]["peak_memory_gb"],
        "load_rss_gb": result["load_peak"]["rss_peak_gb"],
        "trainable_parameters": result["trainable_parameters"],
        "loss_first": result["steps"][0]["loss"],
        "loss_last": result["steps"][-1]["loss"],
        "step_seconds": [round(s["wall_s"], 4) for s in result["steps"]],
        "row_lengths": result["row_lengths"],
        "blas_kernels": result["blas_kernels"],
        "heap": result["heap"],
        "load_average": result["load_average"],
    }
    if "own_tokens_per_s" in timed[0]:  # mlx_lm.lora's own count: its masked targets over its own time
        out["own_tokens_per_s"] = statistics.median(s["own_tokens_per_s"] for s in timed)
    return out


def prepare(args, folder: Path) -> tuple[dict, dict]:
    """The model and the rows in `folder`: (spec for both sides, the workload's description)."""
    from transformers import AutoTokenizer

    if args.model:
        from mlx_grpo.models.loading import model_folder

        path = (
            dequantized_copy(args.model, folder / "float32") if args.dequantize else model_folder(args.model)
        )
        shape = model_shape(path)
    else:
        shape = PRESETS[args.preset]
        path = str(build_random_model(folder / "model", **shape, seed=args.seed, dtype=args.dtype))
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = args.batch_size * max(1, min(args.steps, 8))  # fixed-length rows: a few batches are all it takes
    data = write_rows(folder / "data", tokenizer, rows, args.prompt_tokens, args.completion_tokens, args.seed)
    sample = json.loads((data / "train.jsonl").read_text().splitlines()[0])
    messages = [
        {"role": "user", "content": sample["prompt"]},
        {"role": "assistant", "content": sample["completion"]},
    ]
    row_tokens = (
        len(tokenizer.apply_chat_template(messages, tokenize=True))
        if tokenizer.chat_template
        else args.prompt_tokens + args.completion_tokens + 8
    )
    spec = {
        "model": path,
        "data": str(data),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "micro_batch_size": args.micro_batch_size or args.batch_size,
        "lora_rank": args.lora_rank,
        "lora_layers": args.lora_layers,
        "lora_scale": args.lora_scale,
        "lr": args.lr,
        "max_grad_norm": args.max_grad_norm,
        "seed": args.seed,
        "logprob_chunk_size": args.logprob_chunk_size,
        "row_tokens_max": row_tokens,
    }
    workload = {
        "model": args.model or f"random {args.preset}",
        **shape,
        "dtype": args.dtype,
        "batch_size": args.batch_size,
        "micro_batch_size": spec["micro_batch_size"],
        "steps": args.steps,
        "warmup": args.warmup,
        "prompt_text_tokens": args.prompt_tokens,
        "completion_text_tokens": args.completion_tokens,
        "rows": rows,
        "lora_rank": args.lora_rank,
        "lora_layers": args.lora_layers,
        "lora_scale": args.lora_scale,
        "lr": args.lr,
        "logprob_chunk_size": args.logprob_chunk_size,
        "mask_prompt": True,
    }
    return spec, workload


def run(args) -> dict:
    order = [s for s in args.order.split(",") if s]
    if sorted(order) != sorted(SIDES):
        raise SystemExit(f"error: --order names each of {', '.join(SIDES)} once, got {args.order!r}")
    wanted = [s for s in order if args.peer != "only" or s == "mlx_lm_lora"]
    problem = peer_problem() if args.peer != "off" else "--peer off"
    if args.peer == "only" and problem:
        raise SystemExit(f"error: --peer only: {problem}")
    if problem:
        wanted = [s for s in wanted if s != "mlx_lm_lora"]
    out = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="bench-sft-") as tmp:
        spec, out["workload"] = prepare(args, Path(tmp))
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        results = {side: run_side(side, spec_path, Path(tmp), args.blas) for side in wanted}
    lengths = {side: r["row_lengths"] for side, r in results.items()}
    if len({tuple(v) for v in lengths.values()}) > 1:
        raise SystemExit(
            f"error: the two sides encoded different rows (token lengths {lengths}): not equal work"
        )
    counts = {}
    if "mlx_grpo" in results:  # sft's count of a step's tokens; the same rows on the other side
        first = results["mlx_grpo"]["steps"][0]
        counts = {"tokens": first["tokens"], "trained_tokens": first["trained_tokens"]}
    else:
        length = results["mlx_lm_lora"]["row_lengths"][-1]
        offset = results["mlx_lm_lora"]["prompt_offsets"][-1]
        counts = {"tokens": args.batch_size * length, "trained_tokens": args.batch_size * (length - offset)}
    out["workload"].update(tokens_per_step=counts["tokens"], trained_tokens_per_step=counts["trained_tokens"])
    for side, result in results.items():
        out[side] = summary(result, args.warmup, counts)
    if problem:
        out["mlx_lm_lora"] = {"skipped": problem}
    kernels = {r["blas_kernels"] for r in results.values()}
    out["blas_kernels"] = kernels.pop() if len(kernels) == 1 else "differ: see each side"
    out["machine"]["uptime_end"] = command_output(["uptime"])
    if "tokens_per_s" in out.get("mlx_grpo", {}) and "tokens_per_s" in out.get("mlx_lm_lora", {}):
        ours, peer = out["mlx_grpo"], out["mlx_lm_lora"]
        out["speedup"] = ours["tokens_per_s"] / peer["tokens_per_s"]
        out["memory_ratio"] = ours["peak_memory_gb"] / peer["peak_memory_gb"]
        out["rss_ratio"] = ours["rss_peak_gb"] / peer["rss_peak_gb"]
        out["goal"] = {
            "speedup_at_least": GOAL_SPEEDUP,
            "peak_memory_at_most_ratio": 1.0,
            "met": out["speedup"] >= GOAL_SPEEDUP and out["memory_ratio"] <= 1.0,
        }
    return out


TABLE_COLUMNS = [  # (heading, key, format)
    ("step s", "step_s", ".3f"),
    ("own step s", "own_step_s", ".3f"),
    ("tok/s", "tokens_per_s", ".0f"),
    ("trained tok/s", "trained_tokens_per_s", ".0f"),
    ("padding", "padding_share", ".1%"),
    ("peak GB", "peak_memory_gb", ".2f"),
    ("load peak GB", "load_peak_memory_gb", ".2f"),
    ("RSS GB", "rss_peak_gb", ".2f"),
    ("loss first", "loss_first", ".3f"),
    ("loss last", "loss_last", ".3f"),
]


def table(out: dict) -> str:
    rows = [
        [side] + [format(out[side][k], f) for _, k, f in TABLE_COLUMNS]
        for side in SIDES
        if "step_s" in out.get(side, {})
    ]
    lines = [markdown_table(["trainer"] + [h for h, _, _ in TABLE_COLUMNS], rows)]
    if "speedup" in out:
        lines.append(
            f"\nspeedup {out['speedup']:.2f}x (goal {GOAL_SPEEDUP}x), peak memory ratio "
            f"{out['memory_ratio']:.2f}; BLAS: {out['blas_kernels']}; {out['machine']['cpu']}"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", help="model folder, GGUF file or Hugging Face id (default: a random model of --preset)"
    )
    p.add_argument("--preset", choices=PRESETS, default="tiny", help="shape of the random model")
    p.add_argument("--dtype", default="float32", help="random model's dtype (float32, bfloat16, float16)")
    p.add_argument(
        "--dequantize",
        action="store_true",
        help="run a float32 copy of --model (quantized weights widened): the same weights for both sides",
    )
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument(
        "--micro-batch-size", type=int, default=None, help="sft's micro-batch (default: the batch)"
    )
    p.add_argument("--prompt-tokens", type=int, default=64, help="tokens of each row's prompt text")
    p.add_argument("--completion-tokens", type=int, default=171, help="tokens of each row's completion text")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="first steps left out of the medians (at least 1; mlx_lm.lora traces its compiled step "
        "again at step 2, once the optimizer has its state)",
    )
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument(
        "--lora-layers",
        type=int,
        default=None,
        help="the last N blocks get adapters; -1: all (default: mlx_lm.lora's 16, all of a smaller model)",
    )
    p.add_argument("--lora-scale", type=float, default=20.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="sft's clip (mlx_lm.lora has none)")
    p.add_argument("--logprob-chunk-size", type=int, default=None, help="sft's vocabulary-projection chunk")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--order", default="mlx_grpo,mlx_lm_lora", help="which side runs first")
    p.add_argument(
        "--peer",
        choices=("auto", "off", "only"),
        default="auto",
        help="also run mlx_lm.lora (auto: when it can be imported), or only it",
    )
    p.add_argument(
        "--blas",
        choices=("auto", "stock"),
        default="auto",
        help="auto: both sides with OpenBLAS preloaded when installed on Linux, as the mlx-grpo command "
        "does; stock: the BLAS MLX came with",
    )
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # the child processes'
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side is None:
        if args.warmup < 1 or args.steps <= args.warmup:
            p.error(
                "--warmup must be at least 1 and below --steps (the first step's time is its compilation)"
            )
        if min(args.batch_size, args.prompt_tokens, args.completion_tokens, args.lora_rank) < 1:
            p.error("--batch-size, --prompt-tokens, --completion-tokens and --lora-rank must be at least 1")
        layers = PRESETS[args.preset]["layers"] if not args.model else None
        if args.lora_layers is None:
            args.lora_layers = -1 if layers is not None and layers < 16 else 16
        if layers and args.lora_layers > layers:
            p.error(f"--lora-layers {args.lora_layers}: the {args.preset} model has {layers} layers")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.side:
        side_main(args)
        return None
    out = run(args)
    emit_result(out, args.out, table(out))
    return out


if __name__ == "__main__":
    main()
