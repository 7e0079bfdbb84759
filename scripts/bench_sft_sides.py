"""One side of scripts/bench_sft.py, run in its own process: sft's or mlx_lm.lora's own set-up and
step loop on the spec's workload, one record a step, with the process's peak memory.

bench_sft.py (and profile_sft.py) start this process as `--side NAME --spec FILE --result FILE`;
side_main reads the spec and writes the side's result as JSON.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path


def padded_width_peer(length: int) -> int:
    """mlx_lm.lora's iterate_batches: one plus the next multiple of 32."""
    return 1 + 32 * ((length + 31) // 32)


def _process_peaks() -> dict:
    import mlx.core as mx

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return {
        "peak_memory_gb": mx.get_peak_memory() / 1e9,
        "rss_peak_gb": rss / (1e9 if sys.platform == "darwin" else 1e6),
    }


def run_sft_side(spec: dict) -> dict:
    """sft's own setup and step (run/sft.py) on the spec's workload; one record a step."""
    import mlx.core as mx

    from mlx_grpo.config import build_config
    from mlx_grpo.models.adapters import trainable_parameter_count
    from mlx_grpo.run.sft import batch_indices, micro_batches, pad_id_of, sft_step
    from mlx_grpo.run.sft_setup import sft_setup

    config = build_config(
        {
            "model": spec["model"],
            "data": spec["data"],
            "steps": spec["steps"],
            "batch_size": spec["batch_size"],
            "micro_batch_size": spec["micro_batch_size"],
            "lora_rank": spec["lora_rank"],
            "lora_layers": spec["lora_layers"],
            "lora_scale": spec["lora_scale"],
            "lora_dropout": 0.0,
            "lr": spec["lr"],
            "warmup_steps": 0,
            "weight_decay": 0.0,
            "max_grad_norm": spec["max_grad_norm"],
            "seed": spec["seed"],
            "logprob_chunk_size": spec["logprob_chunk_size"],
        }
    )
    run = sft_setup(config)
    model, pad = run.model, pad_id_of(run.tokenizer)
    loaded = _process_peaks()
    model.train()
    records, end = [], time.perf_counter()
    for step in range(1, spec["steps"] + 1):
        batch = [run.train[i] for i in batch_indices(len(run.train), config.batch_size, step, config.seed)]
        m = sft_step(
            model,
            run.optimizer,
            batch,
            pad,
            config.micro_batch_size,
            config.max_grad_norm,
            config.logprob_chunk_size,
        )
        now = time.perf_counter()
        widths = [
            len(part) * max(len(ids) for ids, _ in part)  # each micro-batch padded to its longest
            for part in micro_batches(batch, config.micro_batch_size)
        ]
        records.append(
            {
                "wall_s": now - end,
                "own_step_s": m["time/step_s"],
                "loss": m["loss"],
                "tokens": m["tokens"],
                "trained_tokens": m["trained_tokens"],
                "padded_tokens": sum(widths),
            }
        )
        end = now
    mx.eval(model.parameters())
    return {
        "steps": records,
        "row_lengths": sorted({len(ids) for ids, _ in run.train + run.valid}),
        "trainable_parameters": trainable_parameter_count(model),
        "load_peak": loaded,
        "heap": "freed memory kept (models/heap.py)",
        **_process_peaks(),
    }


def run_peer_side(spec: dict) -> dict:
    """mlx_lm.lora's own train_model (the `mlx_lm.lora --train` path, less its reporting services)."""
    import types

    import numpy as np
    from mlx_lm import lora
    from mlx_lm.tuner.callbacks import TrainingCallback
    from mlx_lm.tuner.datasets import load_dataset
    from mlx_lm.utils import load

    folder = tempfile.mkdtemp(prefix="bench-sft-peer-")
    settings = {
        **lora.CONFIG_DEFAULTS,
        "model": spec["model"],
        "train": True,
        "data": spec["data"],
        "fine_tune_type": "lora",
        "optimizer": "adamw",
        "optimizer_config": {"adamw": {"weight_decay": 0.0}},
        "mask_prompt": True,
        "num_layers": spec["lora_layers"],
        "batch_size": spec["batch_size"],
        "iters": spec["steps"],
        "learning_rate": spec["lr"],
        "steps_per_report": 1,
        "steps_per_eval": 10**9,
        "save_every": 10**9,
        "adapter_path": folder,
        "seed": spec["seed"],
        "lora_parameters": {"rank": spec["lora_rank"], "dropout": 0.0, "scale": spec["lora_scale"]},
        "max_seq_length": max(2048, spec["row_tokens_max"] + 64),
        "grad_checkpoint": False,
    }
    args = types.SimpleNamespace(**settings)
    np.random.seed(args.seed)  # as lora.run does
    model, tokenizer = load(args.model)
    train_set, _, _ = load_dataset(args, tokenizer)
    rows = [train_set.process(train_set[i]) for i in range(len(train_set))]
    loaded = _process_peaks()
    reports = []

    class Reports(TrainingCallback):
        def on_train_loss_report(self, info):
            reports.append({"at": time.perf_counter(), **info})

    start = time.perf_counter()
    lora.train_model(args, model, train_set, [], Reports())  # no validation set: none runs between steps
    ends = [start] + [r["at"] for r in reports]
    records = [
        {
            "wall_s": b - a,
            "own_step_s": 1.0 / r["iterations_per_second"],
            "loss": r["train_loss"],
            "own_tokens_per_s": r["tokens_per_second"],
            "padded_tokens": spec["batch_size"] * padded_width_peer(max(len(t) for t, _ in rows)),
        }
        for a, b, r in zip(ends, ends[1:], reports)
    ]
    from mlx_grpo.models.adapters import trainable_parameter_count

    return {
        "steps": records,
        "row_lengths": sorted({len(t) for t, _ in rows}),
        "prompt_offsets": sorted({o for _, o in rows}),
        "trainable_parameters": trainable_parameter_count(model),
        "load_peak": loaded,
        "heap": "malloc's defaults",
        **_process_peaks(),
    }


def side_main(args, runner=None) -> None:
    """The child: one trainer on the spec's workload (or `runner(side, spec)`), its result written as JSON."""
    from mlx_grpo.blas import blas_description, use_openblas

    if args.blas == "auto":
        use_openblas()  # re-executes this process with OpenBLAS preloaded, when there is one
    if args.side == "mlx_grpo":
        from mlx_grpo.models.heap import keep_freed_memory

        keep_freed_memory()  # as the mlx-grpo command does
    spec = json.loads(Path(args.spec).read_text())
    runner = runner or (lambda side, spec: run_sft_side(spec) if side == "mlx_grpo" else run_peer_side(spec))
    result = runner(args.side, spec)
    result["blas_kernels"] = blas_description()
    Path(args.result).write_text(json.dumps(result))
