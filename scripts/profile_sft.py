"""Where each SFT trainer spends its step: `mlx-grpo sft` and `mlx_lm.lora` taken apart on equal work.

    python scripts/profile_sft.py --preset smollm2 --steps 6 --warmup 2 --out profile-sft-smollm2.json
    python scripts/profile_sft.py --preset qwen05 --steps 6 --warmup 2 --out profile-sft-qwen05.json

The workload is scripts/bench_sft.py's, built by its own code: the same random model of --preset's
shape, the same JSONL rows, LoRA rank and layers, batch and lengths (its other flags pass through:
--batch-size, --prompt-tokens, --lora-layers, --model, ...). Each side runs in its own process with
bench_sft.py's set-up (OpenBLAS preloaded for both with --blas auto; sft's heap as the command's),
first bench_sft.py's own step loop, then the step's phases one after another on each step's batch,
every phase evaluated (mx.eval) before the next starts:

  batch             the step's rows made into arrays by the side's own code: sft's batch_indices,
                    micro_batches and pad_rows; mlx_lm.lora's iterate_batches (rows tokenized once, cached)
  forward           forward and loss: sft's sft_loss without the gradient (compiled afresh each call, as its
                    gradient is); mlx_lm.lora's default_loss (compiled once, as its step is)
  forward_backward  value and gradients: sft's sft_gradients over its micro-batches (their sum, the loss
                    read back); nn.value_and_grad of default_loss, compiled once with the step's state
  backward          forward_backward - forward (sft's gradient pass works out the frozen head's backward
                    matmul in its forward: logprobs._through_frozen_head; it is counted as backward here)
  optimizer         sft: clip_grad_norm, the norm read back, AdamW; mlx_lm.lora: AdamW, compiled
  step              bench_sft.py's end-to-end step (data, forward, backward, optimizer, the trainer's own
                    bookkeeping) as each trainer runs it: mlx_lm.lora's compiled whole, sft's as sft_step
  other             step - batch - forward_backward - optimizer (the trainer's glue; pieces timed apart
                    need not add up to the whole: a small negative remainder means they overcount a little)

Each figure is the median over the steps after --warmup (--steps counts them, as bench_sft.py's). GFLOP/s
are the step's matmul FLOPs (step_flops) over a phase's seconds, beside float32 sgemm through MLX at the
step's own shapes (measured in the sft side's process, under the same BLAS). A table on stderr, one JSON
object on stdout (and in --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
import bench_sft  # noqa: E402 (the workload, the child processes)
from bench_blas import gflops as sgemm_gflops  # noqa: E402
from bench_sft_sides import run_peer_side, run_sft_side, side_main  # noqa: E402 (the two sides' set-up)
from bench_variants import replaced  # noqa: E402
from bench_workload import forward_flops, model_shape  # noqa: E402
from benchlib import command_output, emit_result, machine, markdown_table  # noqa: E402
from sft_phases import MEASURED, peer_phases, sft_phases  # noqa: E402 (the phases, in a side's process)

PHASES = ("batch", "forward", "forward_backward", "backward", "optimizer", "step", "other")
FLOPS_OF = {
    "forward": ("forward",),
    "backward": ("backward",),
    "forward_backward": ("forward", "backward"),
    "step": ("forward", "backward"),
}  # a phase's matmul work: no FLOPs are counted for the rest
NOT_PASSED_ON = ("--order", "--peer")  # bench_sft.py's flags about its comparison, no part of a profile


# ---------------------------------------------------------------- FLOPs


def step_flops(shape: dict, batch_shapes: list[list[int]], adapters: list[tuple[int, int, int, int]]) -> dict:
    """Matmul FLOPs of one step over micro-batches of (rows, width) tokens; `adapters` (layer, in, rank, out).

    A micro-batch runs P = rows x (width - 1) positions, each seeing n/2 keys on average (n = width - 1).
    forward  = 2 P (every layer's dense weights + the head's V h) + 2 P layers 2 h n/2
               (bench_workload.forward_flops) + 2 P r (in + out) for each LoRA adapter
    backward = the same dense, head and attention terms over the layers from the lowest adapted one up
               only (the weights are frozen: dY W for the input gradient, no weight gradient; below the
               lowest adapter nothing needs one), attention twice (dS, dV, dQ, dK: four matmuls to the
               forward's two), + 4 P r (in + out) for each adapter (its input gradient, and A's and B's)."""
    lowest = min((layer for layer, *_ in adapters), default=shape["layers"])
    top = {**shape, "layers": shape["layers"] - lowest}
    forward = backward = 0.0
    for rows, width in batch_shapes:
        positions, context = rows * (width - 1), (width - 1) / 2
        forward += forward_flops(shape, positions, context)
        dense_top = forward_flops(top, positions, 0)
        backward += dense_top + 2 * (forward_flops(top, positions, context) - dense_top)
        lora = sum(2.0 * positions * rank * (n_in + n_out) for _, n_in, rank, n_out in adapters)
        forward += lora
        backward += 2 * lora
    return {"forward": forward, "backward": backward}


def adapter_shapes(model) -> list[tuple[int, int, int, int]]:
    """(layer, in, rank, out) of every LoRA adapter in the model's layers."""
    return [
        (j, *m.lora_a.shape, m.lora_b.shape[1])
        for j, layer in enumerate(model.layers)
        for _, m in layer.named_modules()
        if hasattr(m, "lora_a") and hasattr(m, "lora_b")
    ]


def sgemm_rates(shape: dict, rows: int, seconds: float) -> list[dict]:
    """float32 GFLOP/s of (rows x k) @ (k x n) through MLX at the step's linears' shapes."""
    h, inter, vocab = shape["hidden"], shape["intermediate"], shape["vocab"]
    shapes = [
        ("q_proj/o_proj", rows, h, h),
        ("gate_proj/up_proj", rows, h, inter),
        ("down_proj", rows, inter, h),
        ("head", rows, h, vocab),
    ]
    return [
        {"linear": name, "shape": [m, k, n], "gflops": sgemm_gflops(m, k, n, seconds)}
        for name, m, k, n in shapes
    ]


# ---------------------------------------------------------------- a side's process


def profile_side(side: str, spec: dict) -> dict:
    """bench_sft.py's side (its set-up, its step loop: the `step` phase), then the phases on the same objects.

    Each side's objects are taken where its set-up hands them to its training loop: sft_setup's return,
    and the arguments mlx_lm.lora's train_model passes to mlx_lm.tuner.trainer.train."""
    import mlx.core as mx

    captured = {}
    if side == "mlx_grpo":
        from mlx_grpo.run import sft_setup as setup_module

        real_setup = setup_module.sft_setup

        def capturing_setup(*args, **kwargs):
            captured["run"] = real_setup(*args, **kwargs)
            return captured["run"]

        with replaced(setup_module, "sft_setup", capturing_setup):
            result = run_sft_side(spec)
        run = captured["run"]
        times, shapes = sft_phases(run, spec["steps"])
        model = run.model
        # at a micro-batch's positions: the rows its matmuls see
        result["sgemm"] = sgemm_rates(
            model_shape(spec["model"]), max(r * (w - 1) for r, w in shapes), spec["sgemm_seconds"]
        )
    else:
        from mlx_lm import lora

        real_train = lora.train

        def capturing_train(**kwargs):
            captured.update(kwargs)
            return real_train(**kwargs)

        with replaced(lora, "train", capturing_train):
            result = run_peer_side(spec)
        model = captured["model"]
        times, shapes = peer_phases(
            model, captured["optimizer"], captured["train_dataset"], captured["args"], spec["steps"]
        )
    mx.eval(model.parameters())
    times["step"] = [s["wall_s"] for s in result["steps"]]
    result.update(
        phase_seconds=times,
        batch_shapes=shapes,
        flops=step_flops(model_shape(spec["model"]), shapes, adapter_shapes(model)),
        openblas_coretype=os.environ.get("OPENBLAS_CORETYPE"),
        peak_memory_after_phases_gb=mx.get_peak_memory() / 1e9,
    )
    return result


# ---------------------------------------------------------------- the parent


def summary(result: dict, warmup: int, tokens: int) -> dict:
    """Each phase's median seconds over the steps after the warm-up, its share of the step and its GFLOP/s."""
    seconds = {name: statistics.median(result["phase_seconds"][name][warmup:]) for name in MEASURED}
    seconds["backward"] = seconds["forward_backward"] - seconds["forward"]
    seconds["other"] = seconds["step"] - seconds["batch"] - seconds["forward_backward"] - seconds["optimizer"]
    phases = {}
    for name in PHASES:
        phases[name] = {"seconds": seconds[name], "share_of_step": seconds[name] / seconds["step"]}
        if name in FLOPS_OF:
            work = sum(result["flops"][part] for part in FLOPS_OF[name])
            phases[name].update(flops=work, gflops=work / seconds[name] / 1e9 if seconds[name] > 0 else None)
    shapes = result["batch_shapes"]
    return {
        "phases": phases,
        "steps_timed": len(result["phase_seconds"]["step"]) - warmup,
        "batch_shapes": shapes,
        "positions_per_step": sum(r * (w - 1) for r, w in shapes),
        "padded_tokens_per_step": sum(r * w for r, w in shapes),
        "flops_per_step": result["flops"],
        "tokens_per_s": tokens / seconds["step"],
        "peak_memory_gb": result["peak_memory_gb"],
        "peak_memory_after_phases_gb": result["peak_memory_after_phases_gb"],
        "rss_peak_gb": result["rss_peak_gb"],
        "trainable_parameters": result["trainable_parameters"],
        "row_lengths": result["row_lengths"],
        "blas_kernels": result["blas_kernels"],
        "openblas_coretype": result["openblas_coretype"],
        "heap": result["heap"],
        "load_average": result["load_average"],
        "phase_seconds": {k: [round(s, 5) for s in v] for k, v in result["phase_seconds"].items()},
    }


def run(args, workload_args) -> dict:
    problem = bench_sft.peer_problem()
    sides = [side for side in bench_sft.SIDES if side == "mlx_grpo" or not problem]
    out = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="profile-sft-") as tmp:
        spec, out["workload"] = bench_sft.prepare(workload_args, Path(tmp))
        spec["sgemm_seconds"] = args.sgemm_seconds
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        results = {
            side: bench_sft.run_side(side, spec_path, Path(tmp), workload_args.blas, script=__file__)
            for side in sides
        }
    lengths = {side: r["row_lengths"] for side, r in results.items()}
    if len({tuple(v) for v in lengths.values()}) > 1:
        raise SystemExit(
            f"error: the two sides encoded different rows (token lengths {lengths}): not equal work"
        )
    first = results["mlx_grpo"]["steps"][0]
    out["workload"].update(
        preset=args.preset, tokens_per_step=first["tokens"], trained_tokens_per_step=first["trained_tokens"]
    )
    ours = results["mlx_grpo"]
    out.update(
        blas_kernels=ours["blas_kernels"], openblas_coretype=ours["openblas_coretype"], sgemm=ours["sgemm"]
    )
    for side, result in results.items():
        out[side] = summary(result, workload_args.warmup, first["tokens"])
    if problem:
        out["mlx_lm_lora"] = {"skipped": problem}
    else:  # above 1: mlx_lm.lora takes longer over that phase
        out["peer_over_sft_seconds"] = {
            name: out["mlx_lm_lora"]["phases"][name]["seconds"] / p["seconds"]
            for name, p in out["mlx_grpo"]["phases"].items()
            if p["seconds"] > 0
        }
    out["machine"]["uptime_end"] = command_output(["uptime"])
    return out


def table(out: dict) -> str:
    sides = [side for side in bench_sft.SIDES if "phases" in out.get(side, {})]
    headings = ["phase"] + [heading for side in sides for heading in (f"{side} s", "share", "GFLOP/s")]
    rows = [
        [name]
        + [
            cell
            for side in sides
            for p in [out[side]["phases"][name]]
            for cell in (
                f"{p['seconds']:.4f}",
                f"{p['share_of_step']:.1%}",
                f"{p['gflops']:.1f}" if p.get("gflops") else "",
            )
        ]
        for name in PHASES
    ]
    lines = [markdown_table(headings, rows)]
    w, m = out["workload"], out["machine"]
    lines.append(
        f"\n{w['model']}: {w['tokens_per_step']} tokens a step ({w['batch_size']} rows); {m['cpu']}, "
        f"{out['blas_kernels']} (OPENBLAS_CORETYPE {out['openblas_coretype'] or 'unset'}), MLX {m['mlx']}"
    )
    lines.append(
        "float32 sgemm through MLX: "
        + "; ".join(
            f"{s['linear']} {'x'.join(map(str, s['shape']))} {s['gflops']:.1f} GFLOP/s" for s in out["sgemm"]
        )
    )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Other flags go to scripts/bench_sft.py's workload (--batch-size, "
        "--prompt-tokens, --completion-tokens, --lora-rank, --lora-layers, "
        "--model, ...)",
    )
    p.add_argument("--preset", choices=bench_sft.PRESETS, default="tiny", help="shape of the random model")
    p.add_argument("--steps", type=int, default=6, help="steps of each side, the warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians (at least 1)")
    p.add_argument(
        "--blas", choices=("auto", "stock"), default="auto", help="as scripts/bench_sft.py's --blas"
    )
    p.add_argument("--sgemm-seconds", type=float, default=1.0, help="time for each sgemm shape")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--side", choices=bench_sft.SIDES, help=argparse.SUPPRESS)  # the child processes'
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.side:
        return args, None
    passed_on = [flag for flag in rest if flag.split("=")[0] in NOT_PASSED_ON]
    if passed_on:
        p.error(f"{', '.join(passed_on)}: the profile runs both sides, sft first")
    if not args.sgemm_seconds > 0:
        p.error("--sgemm-seconds must be above 0")
    workload = bench_sft.parse_args(
        [
            "--preset",
            args.preset,
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--blas",
            args.blas,
            *rest,
        ]
    )
    return args, workload


def main(argv=None):
    args, workload = parse_args(argv)
    if args.side:
        side_main(args, runner=profile_side)
        return None
    out = run(args, workload)
    emit_result(out, args.out, table(out))
    return out


if __name__ == "__main__":
    main()
