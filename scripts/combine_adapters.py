"""A run folder whose LoRA change is a weighted sum of other runs' changes, for `compare` to measure.

Two uses: one run turned around (`RUN:-1`), to see whether what a run changed is a small nudge that
either sign flips the same way or a directed change; and several runs averaged (a "soup"), to see
what their shared part does once the parts they do not share partly cancel.

LoRA changes a weight by scale * A @ B (mlx-lm's layout: A is (in, r), B is (r, out)). A sum
sum_i w_i A_i B_i is again a LoRA, of rank sum_i r_i: the A_i side by side and the w_i B_i stacked,
so mlx-lm loads the result as it is, with the rank in adapter_config.json raised to match. The first
run's config.yaml comes along, so `compare` finds the task, data and prompt it trained with.

    python scripts/combine_adapters.py RUN:-1 --output RUN-negated
    python scripts/combine_adapters.py RUN1 RUN2 RUN3 RUN4 --output SOUP     # 1/4 each
    mlx-grpo compare --trained SOUP --n 400
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx

from mlx_grpo.files import atomic_save_safetensors, atomic_write_json


def combine(adapters: list[dict[str, mx.array]], weights: list[float]) -> dict[str, mx.array]:
    """LoRA tensors (mlx-lm's names, `...lora_a`/`...lora_b`) whose A @ B is sum_i weights[i] * A_i @ B_i."""
    names = set(adapters[0])
    for other in adapters[1:]:
        if set(other) != names:
            raise ValueError(f"the adapters train different layers: {sorted(names ^ set(other))[:4]}")
    not_lora = sorted(n for n in names if not n.endswith((".lora_a", ".lora_b")))
    if not_lora:
        raise ValueError(f"only LoRA adapters combine this way (A @ B); found {not_lora[:3]}")
    combined = {}
    for name in names:
        if name.endswith(".lora_a"):
            combined[name] = mx.concatenate([a[name] for a in adapters], axis=1)
        else:
            combined[name] = mx.concatenate([w * a[name] for a, w in zip(adapters, weights)], axis=0)
    return combined


def _run_and_weight(text: str) -> tuple[Path, float | None]:
    path, sep, weight = text.rpartition(":")
    try:
        return (Path(path), float(weight)) if sep else (Path(text), None)
    except ValueError:  # a colon in the folder's name, not a weight
        return Path(text), None


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "runs", nargs="+", help="RUN or RUN:WEIGHT (a run or adapter folder); without weights, 1/n each"
    )
    p.add_argument("--output", required=True, type=Path, help="the new run folder (must not exist)")
    args = p.parse_args(argv)
    pairs = [_run_and_weight(r) for r in args.runs]
    given = [w for _, w in pairs if w is not None]
    if given and len(given) != len(pairs):
        p.error("give every run a weight, or none (then each gets 1/n)")
    weights = given or [1 / len(pairs)] * len(pairs)
    configs = [json.loads((run / "adapter_config.json").read_text()) for run, _ in pairs]
    first = configs[0]

    def must_match(c: dict) -> dict:  # what every run must share for their A @ B to add up
        return {
            "model": c.get("model"),
            "num_layers": c.get("num_layers"),
            "LoRA scale": c["lora_parameters"]["scale"],
        }

    expected = must_match(first)
    for run_config, (run, _) in zip(configs, pairs):
        if run_config.get("fine_tune_type", "lora") != "lora":
            p.error(
                f"{run}: {run_config.get('fine_tune_type')} adapters; only LoRA combines as a sum of A @ B"
            )
        for key, value in must_match(run_config).items():
            if value != expected[key]:
                p.error(f"{run}: {key} {value!r}, but {pairs[0][0]} has {expected[key]!r}")
    if args.output.exists():
        p.error(f"{args.output} exists; name a new folder")
    combined = combine([mx.load(str(run / "adapters.safetensors")) for run, _ in pairs], weights)
    args.output.mkdir(parents=True)
    atomic_save_safetensors(args.output / "adapters.safetensors", combined)
    out_config = dict(
        first,
        lora_parameters=dict(
            first["lora_parameters"], rank=sum(c["lora_parameters"]["rank"] for c in configs)
        ),
    )
    out_config["combined_from"] = [{"run": str(run), "weight": w} for (run, _), w in zip(pairs, weights)]
    atomic_write_json(args.output / "adapter_config.json", out_config)
    if (pairs[0][0] / "config.yaml").is_file():
        shutil.copy(pairs[0][0] / "config.yaml", args.output / "config.yaml")
    print(f"{args.output}: " + " + ".join(f"{w:g} x {run}" for (run, _), w in zip(pairs, weights)))
    return args.output


if __name__ == "__main__":
    main()
