#!/usr/bin/env bash
# The test suite and every CLI command on a CUDA machine, through MLX's CUDA backend
# (the mlx-cuda-13 wheel), with the GPU as MLX's default device.
#
# The GPU machine reaches no package index and takes at most 64 MiB of files a call,
# so the wheels travel with the working tree, repacked and cut in two:
#   here:                                   bash scripts/gpu_check.sh wheels   (writes .gpu-wheels/a and b)
#   GPU machine, call 1, carrying .gpu-wheels/a:  bash scripts/gpu_check.sh stash
#   GPU machine, call 2, carrying .gpu-wheels/b:  bash scripts/gpu_check.sh        (while still warm)
# `install` alone installs MLX's CUDA build, the missing wheels and this project (editable)
# into the machine's python3; scripts/gpu_bench.sh uses it. Logs go to $OUT (or /tmp/gpu-check).
#
# The mlx-cuda-13 wheel is 90 MB of zip; unpacked and recompressed with xz -9 it is 75 MB,
# still one call too many. The first part is 48 MB: with the working tree (9 MB at 1c53535) a
# 58 MB part went over a call's 64 MiB. GPU_WHEELS names another wheel folder (default .gpu-wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=$(realpath -m "${GPU_WHEELS:-.gpu-wheels}")
stash=/tmp/gpu-stash
mlx_version=0.32.4

case "${1:-run}" in
wheels)
    tmp=$(mktemp -d)
    "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_35_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp" \
        mlx==$mlx_version mlx-cuda-13==$mlx_version "mlx-lm>=0.32.2,<0.33" mlx-lm-lora==5.10.2 \
        datasets dill multiprocess "gguf>=0.17" "rank-bm25>=0.2.2"
    mkdir -p "$tmp/unpacked" "$wheels/a" "$wheels/b"
    (cd "$tmp/unpacked" && python3 -m zipfile -e "$tmp"/mlx_cuda_13-*.whl . && tar cf - . | xz -9e -T0 > "$tmp/mlxcu.tar.xz")
    split -b 48000000 -d "$tmp/mlxcu.tar.xz" "$wheels/a/mlxcu.tar.xz.part-"
    mv "$wheels/a/mlxcu.tar.xz.part-01" "$wheels/b/"
    (cd "$tmp" && sha256sum mlxcu.tar.xz) > "$wheels/b/SHA256SUMS"
    find "$tmp" -maxdepth 1 -name '*.whl' ! -name 'mlx_cuda_13-*' -exec cp {} "$wheels/b/" \;
    rm -rf "$tmp"
    du -sh "$wheels"/a "$wheels"/b
    exit 0 ;;
stash)
    mkdir -p "$stash" && cp "$wheels"/a/* "$stash"/ && ls -l "$stash"
    exit 0 ;;
install|run) ;;
*) echo "usage: $0 [wheels|stash|install|run]" >&2; exit 2 ;;
esac

if ! python3 -c "import mlx.core" 2>/dev/null; then
    # Into the interpreter's own site-packages: libmlx.so finds cuBLAS, cuDNN and NCCL
    # through paths relative to it (../../nvidia/*/lib), where the image has them.
    site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    cat "$stash"/mlxcu.tar.xz.part-00 "$wheels"/b/mlxcu.tar.xz.part-01 > /tmp/mlxcu.tar.xz
    (cd /tmp && sha256sum -c "$wheels/b/SHA256SUMS")
    tar xJf /tmp/mlxcu.tar.xz -C "$site"
    python3 -m pip install -q --no-index --no-deps --no-compile "$wheels"/b/*.whl
fi
# Installed, not only importable: tests run `mlx-grpo` as a command.
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
[ "${1:-run}" = install ] && exit 0

out="${OUT:-/tmp/gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# The suite: tests/conftest.py turns TF32 off (see there); float64 tests run on the CPU device.
status=0
python3 -m pytest tests -n 8 -q -rfEs -p no:cacheprovider > "$out/suite.txt" 2>&1 || status=$?
tail -3 "$out/suite.txt"

# Every command, as a user runs it, from a scratch folder.
tree=$PWD
work=$(mktemp -d) && cd "$work"
run_cli() {
    echo "== mlx-grpo $*" | tee -a "$out/cli.log"
    local start=$SECONDS rc=0
    timeout 600 mlx-grpo "$@" > "$work/last.log" 2>&1 || rc=$?
    cat "$work/last.log" >> "$out/cli.log"
    tail -2 "$work/last.log"
    echo "rc=$rc $((SECONDS - start))s" | tee -a "$out/cli.log"
    [ $rc = 0 ] || status=1
}
run_cli train
run=$(ls -d checkpoints/*/ | head -1)
run_cli eval --model "$run" --n 200
run_cli compare --trained "$run" --n 200
run_cli plot "$run"
run_cli inspect "$run"
run_cli export "$run" --gguf "$work/model.gguf" --mlx "$work/model-mlx"
run_cli train --task web --steps 2
exit $status
