#!/usr/bin/env bash
# The benchmark on a CUDA machine, through MLX's CUDA backend (the mlx-cuda-13 wheel).
#
# The machine reaches no package index, so the wheels travel with the working
# tree, which may carry at most 64 MiB a call; the 90 MB mlx-cuda-13 wheel is
# cut in two (see docs/performance.md for how .gpu-wheels/ is made):
#   call 1, carrying .gpu-wheels/a:  bash scripts/gpu_bench.sh stash
#   call 2, carrying .gpu-wheels/b:  bash scripts/gpu_bench.sh run    (while the machine is still warm)
# The results are JSON files in $OUT (or /tmp/gpu-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl

if [ "${1:-run}" = stash ]; then
    mkdir -p .gpu-stash && cp .gpu-wheels/a/* .gpu-stash/ && ls -l .gpu-stash
    exit 0
fi

out="${OUT:-/tmp/gpu-bench}"
mkdir -p "$out"
if ! python3 -c "import mlx.core" 2>/dev/null; then
    cat .gpu-stash/"$wheel".part-00 .gpu-wheels/b/"$wheel".part-01 > /tmp/"$wheel"
    (cd /tmp && sha256sum -c "$OLDPWD/.gpu-wheels/b/SHA256SUMS")
    # Into the interpreter's own site-packages: libmlx.so finds cuBLAS, cuDNN, NCCL
    # through paths relative to it (../../nvidia/*/lib), where the image has them.
    python3 -m pip install -q --no-index --no-deps --no-compile /tmp/"$wheel" .gpu-wheels/b/*.whl
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

# The issue's tiny workload, then a Qwen2.5-0.5B-shaped one in bfloat16.
python3 scripts/bench.py --steps 20 --out "$out/gpu_tiny.json" > /dev/null
python3 scripts/bench.py --preset qwen0.5b --dtype bfloat16 --prompts 8 --group-size 8 --max-tokens 256 \
    --steps 4 --out "$out/gpu_qwen05b.json" > /dev/null
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
