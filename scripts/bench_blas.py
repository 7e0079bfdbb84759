"""Float32 matmul GFLOP/s of MLX's CPU backend under each BLAS this machine has, side by side.

    python scripts/bench_blas.py                      # every candidate found, 1 s a shape
    python scripts/bench_blas.py --seconds 2 --rounds 3 --json blas.json

Candidates, each measured in a fresh process (the BLAS is chosen when a process starts):
the system OpenBLAS with the kernels it picks itself (an OPENBLAS_CORETYPE set in the
environment is taken out), the same library with OPENBLAS_CORETYPE forced to each of
--cores, MKL from pip (the `fastblas` extra) when installed, and the mlx wheel's
reference BLAS (--reference; slow, so off by default).
The shapes are those of a Qwen2.5-0.5B step (hidden 896, intermediate 4864, vocabulary
151,936) and one large square. --rounds > 1 runs the candidates round-robin and reports
each figure's median, so a change in the machine's load hits every candidate alike.
Each process also checks its matmul against NumPy in float64 (`max rel error`).
A table on stderr, one JSON object on stdout (and in --json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path

from mlx_grpo.blas import (
    CORETYPE,
    MKL_THREADS,
    cpu_flags,
    openblas_identity,
    pip_mkl_path,  # noqa: E402
    system_openblas_path,
)
from benchlib import Timer, cpu_model, emit_result, markdown_table  # noqa: E402

SHAPES = [  # (name, m, k, n)
    ("2048 x 2048 x 2048", 2048, 2048, 2048),
    ("32 x 896 x 4864 (0.5B decode, 32 rows)", 32, 896, 4864),
    ("512 x 896 x 4864 (0.5B update)", 512, 896, 4864),
    ("32 x 896 x 151936 (0.5B output head)", 32, 896, 151936),
    ("1 x 896 x 4864 (one row)", 1, 896, 4864),
]


def gflops(m: int, k: int, n: int, seconds: float, dtype=None) -> float:
    """GFLOP/s of (m x k) @ (k x n) in float32 (or `dtype`), repeated for `seconds` after one warm-up."""
    import mlx.core as mx

    a, b = mx.random.normal((m, k)), mx.random.normal((k, n))
    if dtype is not None:
        a, b = a.astype(dtype), b.astype(dtype)
    mx.eval(a @ b)
    reps = 0
    with Timer() as timer:
        while timer.seconds < seconds or reps < 2:
            mx.eval(a @ b)
            reps += 1
    return 2 * m * k * n * reps / timer.seconds / 1e9


def child(seconds: float) -> dict:
    """Runs inside a candidate's process: its BLAS as the process sees it, and every shape's rate."""
    from mlx_grpo.blas import blas_description, matmul_error

    return {
        "blas": blas_description(),
        "max_rel_error": matmul_error(),
        "gflops": {name: gflops(m, k, n, seconds) for name, m, k, n in SHAPES},
    }


def own_identity(library: str) -> tuple[str, str] | None:
    """(version, kernels) that OpenBLAS in `library` picks itself, asked in a process without
    OPENBLAS_CORETYPE, the environment its "(its own choice)" candidate runs in: here a CORETYPE set by
    the user or the machine would name its kernels instead, and loading it would start its threads."""
    env = {k: v for k, v in os.environ.items() if k != CORETYPE}
    out = subprocess.run(
        [sys.executable, __file__, "--identity", library], env=env, capture_output=True, text=True, check=True
    )
    identity = json.loads(out.stdout)
    return tuple(identity) if identity else None


def candidates(cores: list[str], reference: bool) -> list[tuple[str, dict]]:
    """(label, environment changes) for every BLAS found here."""
    found = []
    system = system_openblas_path()
    identity = system and own_identity(system)
    if identity:
        version, own = identity
        found.append((f"OpenBLAS {version}, {own} (its own choice)", {"LD_PRELOAD": system, CORETYPE: None}))
        found += [
            (f"OpenBLAS {version}, {core} (forced)", {"LD_PRELOAD": system, CORETYPE: core})
            for core in cores
            if core.lower() != own.lower()
        ]
    mkl = pip_mkl_path()
    if mkl:
        threads = {
            name: os.environ.get(name, value) for name, value in MKL_THREADS.items()
        }  # as mlx-grpo runs it
        found.append(("MKL (pip)", {"LD_PRELOAD": mkl, **threads, CORETYPE: None}))
    if reference:
        found.append(("reference (mlx wheel)", {"LD_PRELOAD": None, CORETYPE: None}))
    return found


def run_candidate(changes: dict, seconds: float) -> dict:
    env = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--seconds", str(seconds)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=1.0, help="time spent on each shape")
    p.add_argument("--rounds", type=int, default=1, help="round-robin passes over the candidates (medians)")
    p.add_argument(
        "--cores",
        default="SkylakeX,Cooperlake,Haswell,Prescott",
        help="OPENBLAS_CORETYPE values to force, comma-separated ('' for none)",
    )
    p.add_argument("--reference", action="store_true", help="also the mlx wheel's reference BLAS (slow)")
    p.add_argument("--json", help="write the JSON here instead of stdout")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--identity", help=argparse.SUPPRESS)  # own_identity's process: the library to ask
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.seconds)))
        return {}
    if args.identity:
        print(json.dumps(openblas_identity(args.identity)))
        return {}
    if os.environ.get(CORETYPE):  # the candidates set or unset it, so the user's choice is not what runs
        print(
            f"note: {CORETYPE}={os.environ[CORETYPE]} is set here; the candidates run without it or with "
            f"--cores' values (list it in --cores to measure it)",
            file=sys.stderr,
        )

    found = candidates([c for c in args.cores.split(",") if c], args.reference)
    if not found:
        sys.exit("no BLAS to compare: no system OpenBLAS and no MKL from pip (see docs/performance.md)")
    runs: dict[str, list[dict]] = {label: [] for label, _ in found}
    for round_ in range(args.rounds):
        for label, changes in found:
            print(f"round {round_ + 1}/{args.rounds}: {label}", file=sys.stderr, flush=True)
            runs[label].append(run_candidate(changes, args.seconds))

    results = {}
    for label, measured in runs.items():
        results[label] = {
            "blas": measured[0]["blas"],
            "max_rel_error": max(r["max_rel_error"] for r in measured),
            "gflops": {name: statistics.median(r["gflops"][name] for r in measured) for name, *_ in SHAPES},
        }
    cpu = cpu_model()
    report = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "avx512f": "avx512f" in cpu_flags(),
        "seconds": args.seconds,
        "rounds": args.rounds,
        "results": results,
    }

    labels = list(results)
    rows = [[name] + [f"{results[lab]['gflops'][name]:.0f}" for lab in labels] for name, *_ in SHAPES]
    rows.append(["max rel error vs float64"] + [f"{results[lab]['max_rel_error']:.0e}" for lab in labels])
    table = (
        f"\n{markdown_table(['shape (m x k x n)'] + labels, rows)}\n"
        f"GFLOP/s, float32 mx.matmul, median of {args.rounds} round(s); CPU: {cpu}, {os.cpu_count()} cores"
    )
    emit_result(report, args.json, table, indent=1)
    return report


if __name__ == "__main__":
    main()
