#!/usr/bin/env bash
# The benchmark on a CUDA machine, through MLX's CUDA backend (the mlx-cuda-13 wheel).
#
# The wheels travel as scripts/gpu_check.sh describes (`gpu_check.sh wheels` here, then on the
# GPU machine `gpu_check.sh stash` carrying .gpu-wheels/a and this script carrying .gpu-wheels/b).
# PEER=off leaves mlx-lm-lora out (its 0.5B-shape step takes about a minute on an H100).
# The results are JSON files in $OUT (or /tmp/gpu-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/gpu_check.sh install
out="${OUT:-/tmp/gpu-bench}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# The issue's tiny workload, then a Qwen2.5-0.5B-shaped one in bfloat16.
python3 scripts/bench.py --steps 20 --peer "${PEER:-auto}" --out "$out/gpu_tiny.json" > /dev/null
python3 scripts/bench.py --preset qwen0.5b --dtype bfloat16 --prompts 8 --group-size 8 --max-tokens 256 \
    --steps 4 --peer "${PEER:-auto}" --out "$out/gpu_qwen05b.json" > /dev/null
python3 - "$out"/gpu_*.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    print(path, d["device"], "matmul peak", round(d["matmul_peak_gflops"]), "GFLOP/s", "speedup", d.get("speedup"))
    for name in ("mlx_grpo", "mlx_lm_lora"):
        if name in d:
            r = d[name]
            print(f"  {name}: step {r['step_s']:.3f}s rollout {r['rollout_s']:.3f}s update {r['update_s']:.3f}s "
                  f"{r['rollout_tokens_per_s']:.0f} rollout tok/s {r['train_tokens_per_s']:.0f} train tok/s "
                  f"peak {r['peak_memory_gb']:.2f} GB {r['achieved_gflops']:.0f} GFLOP/s "
                  f"({100 * r['achieved_frac_of_peak']:.1f}% of peak)")
PY
