"""The update traced against compiled whole (update/gradients.py COMPILE_ON_CPU), in one process, interleaved.

Separate runs of profile_update.py (--traced or not) differ by as much as the machine's own drift
from one run to the next; here both take turns on the same model, batch and memory, so the drift
falls on both. The batch is profile_update.py's synthetic one (a prompt of --prompt-tokens and
--group-size completions of --max-tokens tokens, cut into the trainer's own pieces), and each
update is update/step.update as the trainer calls it. The first round warms up and is left out.

    python scripts/probe_compiled_update.py --model qwen2.5-coder-0.5b-q4_k_m.gguf [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mlx_grpo.blas import blas_description, use_openblas  # noqa: E402


def main() -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a GGUF file, model folder or alias (quantized: run on a float32 "
                                                  "copy, as the trainer runs it)")
    p.add_argument("--prompt-tokens", type=int, default=150)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--rounds", type=int, default=4, help="rounds of (traced, compiled); the first warms up")
    args = p.parse_args()
    use_openblas()  # re-executes with OpenBLAS preloaded, as the mlx-grpo command does
    import mlx.core as mx

    from profile_update import synthetic_update
    from mlx_grpo.models.adapters import prepare_for_training
    from mlx_grpo.models.loading import load_policy
    from mlx_grpo.run.trainer import make_optimizer, update_settings
    from mlx_grpo.update import gradients, step

    model, _ = load_policy(args.model)  # the trainer's loader: a quantized base becomes a float32 copy
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": args.lora_rank, "scale": 20.0, "dropout": 0.0, "num_layers": -1})
    shape = argparse.Namespace(prompts=1, prompt_tokens=args.prompt_tokens, group_size=args.group_size,
                               max_tokens=args.max_tokens, lora_rank=args.lora_rank, lora_layers=-1, micro_batch=None)
    config, prep = synthetic_update(model, args.model, model.args.vocab_size, shape)
    settings, optimizer = update_settings(config), make_optimizer(config)
    seconds: dict[str, list[float]] = {"traced": [], "compiled": []}
    for round_ in range(args.rounds):
        for mode in seconds:
            gradients.COMPILE_ON_CPU = mode == "compiled"
            mx.reset_peak_memory()
            start = time.perf_counter()
            step.update(model, optimizer, settings, prep.sizes, prep.parts, None, prep.chunk)
            mx.synchronize()
            elapsed = time.perf_counter() - start
            if round_:
                seconds[mode].append(round(elapsed, 2))
            print(f"round {round_} {mode}: {elapsed:.2f} s, MLX peak {mx.get_peak_memory() / 1e9:.2f} GB"
                  + (" (warm-up)" if not round_ else ""), file=sys.stderr, flush=True)
    pairs = [c / t for t, c in zip(seconds["traced"], seconds["compiled"])]
    out = {"blas_kernels": blas_description(), "pieces": [list(mb.completions.shape) for mb in prep.parts],
           "seconds": seconds, "median": {k: statistics.median(v) for k, v in seconds.items() if v},
           "compiled_over_traced_per_round": [round(r, 3) for r in pairs]}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
