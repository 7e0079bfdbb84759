"""Our rollout against MLX's own bare decode loop, at the same model and width, on whatever backend runs it.

    python scripts/decode_ceiling.py                          # random Qwen2.5-0.5B shape, widths 1 8 32
    python scripts/decode_ceiling.py --model FILE.gguf --widths 1 8 32 64 --tokens 64

The bare loop is what mlx-lm does at its simplest: the model on a prompt cache,
one token a step for every row, argmax, `mx.async_eval` of the next step before
reading this one, nothing else. Ours is `sample_completions` at temperature 1
with behaviour log-probs and per-completion seeding, no token ending a row
(every row decodes --tokens tokens: the same work as the bare loop). Both
start from the same prompt; prefill is outside both timings. Prints one JSON
object: per width, ms a step and tok/s of each and ours as a fraction of the bare loop.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402

from mlx_grpo.blas import blas_description, use_openblas  # noqa: E402
from mlx_grpo.models.heap import keep_freed_memory  # noqa: E402
from mlx_grpo.models.random_model import build_random_model  # noqa: E402

from benchlib import Timer, emit_result, load_average  # noqa: E402 (scripts/ is on the path)
from decode_loops import bare_loop  # noqa: E402


def ours(model, tokenizer, prompt: list[int], width: int, tokens: int) -> float:
    """Seconds a step of sample_completions (T 1, log-probs, seeded), no stops, prefill left out."""
    from bench_variants import stops_ignored

    from mlx_grpo.sampling import fixed_decode
    from mlx_grpo.sampling.rollout import SamplingConfig, sample_completions

    sampling = SamplingConfig(temperature=1.0, max_tokens=tokens)
    with stops_ignored(tokenizer):
        sample_completions(model, tokenizer, [prompt], width, sampling, seed=0)  # compiles this width's step
        prefill = fixed_decode.PREFILL.seconds
        with Timer() as timer:
            out = sample_completions(model, tokenizer, [prompt], width, sampling, seed=1)
        seconds = timer.seconds - (fixed_decode.PREFILL.seconds - prefill)
    assert all(len(c.tokens) == tokens for c in out)
    return seconds / tokens


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", help="model folder or GGUF file (default: a random model of Qwen2.5-0.5B's shape)"
    )
    p.add_argument("--widths", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--tokens", type=int, default=48, help="tokens each row decodes")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    if argv is None:
        use_openblas()
        keep_freed_memory()  # as the mlx-grpo command does (models/heap.py)
    from bench_workload import PRESETS

    from mlx_grpo.models.loading import load_policy

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or str(build_random_model(Path(tmp) / "m", **PRESETS["qwen0.5b"]))
        model, tokenizer = load_policy(path)
        model.eval()
        prompt = tokenizer.encode("Write a function that returns the last element of a list, in OCaml.")
        bare_loop(model, prompt, 1, 4)  # the weights' first touch (page faults, caches) is no width's cost
        rows = []
        for width in args.widths:
            bare = bare_loop(model, prompt, width, args.tokens)
            mine = ours(model, tokenizer, prompt, width, args.tokens)
            rows.append(
                {
                    "width": width,
                    "bare_ms": 1000 * bare,
                    "ours_ms": 1000 * mine,
                    "bare_tok_s": width / bare,
                    "ours_tok_s": width / mine,
                    "ours_over_bare": bare / mine,
                }
            )
            print(
                f"width {width:4d}: bare {1000 * bare:7.1f} ms/step, ours {1000 * mine:7.1f} ms/step, "
                f"ours {bare / mine:.2f}x the bare loop",
                file=sys.stderr,
                flush=True,
            )
    out = {
        "model": args.model or "random qwen0.5b shape",
        "device": str(mx.default_device()),
        "blas_kernels": blas_description(),
        "load_average": load_average(),
        "tokens": args.tokens,
        "widths": rows,
    }
    emit_result(out, args.out, indent=1)


if __name__ == "__main__":
    main()
