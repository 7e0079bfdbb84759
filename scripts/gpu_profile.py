"""Where a Qwen2.5-0.5B-shaped bfloat16 GRPO step spends its time (made for MLX's CUDA backend).

    python scripts/gpu_profile.py decode            # the compiled decode step at widths 1, 8, 64, 256
    python scripts/gpu_profile.py update            # one micro-batch's loss and gradient, several shapes
    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \\
        python scripts/gpu_profile.py decode --ncu  # one step's kernels under Nsight Compute

decode: per step, the Python call of the compiled step ("build"), `mx.async_eval` returning
(MLX encoding and launching the kernels: "encode"), the wait for the result, and the loop's
wall time, for LoRA as three matmuls (what samples in bfloat16), LoRA merged into the weight,
and adapters off. update: time and peak memory of value_and_grad over one micro-batch.
Environment variables such as MLX_MAX_OPS_PER_BUFFER apply per process. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.tuner.lora import LoRALinear

sys.path.insert(0, str(Path(__file__).parent))
from bench_workload import PRESETS  # noqa: E402

from mlx_grpo.models.adapters import _modules_swapped, adapters_disabled, prepare_for_training  # noqa: E402
from mlx_grpo.models.loading import load_policy  # noqa: E402
from mlx_grpo.models.random_model import build_random_model  # noqa: E402
from mlx_grpo.sampling import fixed_decode  # noqa: E402
from mlx_grpo.sampling.rollout import SamplingConfig, draw_tokens  # noqa: E402
from mlx_grpo.update.logprobs import completion_logprobs  # noqa: E402

PROMPT_TOKENS, MAX_TOKENS = 71, 256


def merged_in_bfloat16(model):
    """Every LoRA layer as one linear, whatever its dtype (adapters_merged does float32 only)."""
    return _modules_swapped(model, [(n, m.fuse()) for n, m in model.named_modules() if type(m) is LoRALinear])


def decode_timings(model, vocab, width, steps=40, ncu=False):
    sampling = SamplingConfig(temperature=1.0, max_tokens=MAX_TOKENS)
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, vocab, PROMPT_TOKENS)]
    prefix = 128  # the prompt's buffer length, rounded up as decode() does
    keys, values = fixed_decode._prefilled_buffers(model, [prompt] * width, prefix, MAX_TOKENS)
    # attention over the whole buffer at every step (decode() reads only the slots written so far)
    step = fixed_decode._make_step(
        model, lambda logits, keys: draw_tokens(logits, keys, sampling), prefix + MAX_TOKENS
    )
    padding = mx.zeros((width,), dtype=mx.int32)
    random_keys = mx.random.randint(0, 2**31, (steps + 1, width, 2)).astype(mx.uint32)
    pending = step(
        mx.array([prompt[-1]] * width, dtype=mx.int32),
        keys,
        values,
        mx.array(prefix, dtype=mx.int32),
        padding,
        random_keys[0],
    )
    mx.eval(pending)
    if ncu:  # one more step, alone, between cudaProfilerStart and Stop
        import torch  # its cudart binding only

        mx.synchronize()
        torch.cuda.profiler.start()
        mx.eval(
            step(
                pending[0],
                pending[2],
                pending[3],
                mx.array(prefix + 1, dtype=mx.int32),
                padding,
                random_keys[1],
            )
        )
        mx.synchronize()
        torch.cuda.profiler.stop()
        return {}
    build, encode, wait, wall = [], [], [], []
    last = time.perf_counter()
    for t in range(1, steps):  # the decode loop's pattern: queue step t, then read step t - 1
        chosen, chosen_logprobs, keys, values = pending
        a = time.perf_counter()
        queued = step(chosen, keys, values, mx.array(prefix + t, dtype=mx.int32), padding, random_keys[t])
        b = time.perf_counter()
        mx.async_eval(queued)
        c = time.perf_counter()
        chosen.tolist()
        chosen_logprobs.tolist()
        d = time.perf_counter()
        pending = queued
        build.append(b - a)
        encode.append(c - b)
        wait.append(d - c)
        wall.append(d - last)
        last = d
    mx.eval(pending)

    def ms(xs):
        return round(1e3 * statistics.median(xs[5:]), 3)

    return {
        "width": width,
        "build_ms": ms(build),
        "encode_ms": ms(encode),
        "wait_ms": ms(wait),
        "step_ms": ms(wall),
        "tokens_per_s": round(width / statistics.median(wall[5:])),
    }


def update_timing(model, vocab, prompts, rows, completion_length, chunk):
    rng = np.random.default_rng(rows + completion_length)
    prompt_ids = mx.array(rng.integers(3, vocab, (prompts, PROMPT_TOKENS)), dtype=mx.int32)
    completions = mx.array(rng.integers(3, vocab, (rows, completion_length)), dtype=mx.int32)
    advantages = mx.array(rng.normal(size=rows).astype(np.float32))

    def loss(model):
        logp, _ = completion_logprobs(
            model, prompt_ids, mx.zeros((prompts,), mx.int32), completions, rows // prompts, 1.0, chunk
        )
        return -(logp * advantages[:, None]).mean()

    loss_and_grad = nn.value_and_grad(model, loss)
    mx.reset_peak_memory()
    times = []
    for _ in range(4):
        start = time.perf_counter()
        mx.eval(loss_and_grad(model))
        times.append(time.perf_counter() - start)
    return {
        "rows": rows,
        "queries": completion_length - 1,
        "chunk": chunk,
        "s": round(statistics.median(times[1:]), 4),
        "peak_gb": round(mx.get_peak_memory() / 1e9, 2),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=("decode", "update"))
    p.add_argument("--widths", default="1,8,64,256", help="decode widths (LoRA as three matmuls)")
    p.add_argument("--ncu", action="store_true", help="profile one decode step at width 64 (under ncu)")
    p.add_argument("--preset", choices=PRESETS, default="qwen0.5b", help="shape of the random model")
    args = p.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="gpu-profile-"))
    shape = PRESETS[args.preset]
    vocab = shape["vocab"]
    build_random_model(folder, **shape, dtype="bfloat16")
    model, _ = load_policy(str(folder))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 8, "scale": 20.0, "dropout": 0.0, "num_layers": -1})
    # Non-zero adapters, as after some training.
    model.update(nn.utils.tree_map(lambda w: w + 0.01, model.trainable_parameters()))
    mx.eval(model.parameters())

    result = {"device": str(mx.default_device()), "mlx": mx.__version__}
    if args.part == "decode" and args.ncu:
        decode_timings(model, vocab, 64, ncu=True)
        return
    if args.part == "decode":
        result["lora_three_matmuls"] = [decode_timings(model, vocab, int(w)) for w in args.widths.split(",")]
        with merged_in_bfloat16(model):
            result["lora_merged_bfloat16"] = [decode_timings(model, vocab, 64)]
        with adapters_disabled(model):
            result["adapters_off"] = [decode_timings(model, vocab, 64)]
    else:
        result["update"] = [
            update_timing(model, vocab, prompts, rows, length, chunk)
            for prompts, rows, length, chunk in [
                (2, 16, 256, 6),
                (2, 16, 256, 32),
                (2, 16, 256, 128),
                (2, 16, 256, None),
                (8, 64, 256, 32),
                (8, 64, 256, None),
                (2, 16, 257, 6),
            ]
        ]
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
