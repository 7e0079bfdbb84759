"""scripts/bench_blas.py: each BLAS in a process of its own, every shape measured, the kernels named as they
ran."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_blas", ROOT / "scripts" / "bench_blas.py")
bench_blas = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_blas)


def test_forced_kernels_are_listed_apart_from_the_librarys_own(monkeypatch):
    monkeypatch.setattr(bench_blas, "system_openblas_path", lambda: "/lib/libblas.so.3")
    monkeypatch.setattr(bench_blas, "own_identity", lambda lib: ("0.3.21", "SkylakeX"))
    monkeypatch.setattr(bench_blas, "pip_mkl_path", lambda: None)
    found = dict(bench_blas.candidates(["SkylakeX", "Haswell"], reference=True))
    assert list(found) == [
        "OpenBLAS 0.3.21, SkylakeX (its own choice)",
        "OpenBLAS 0.3.21, Haswell (forced)",
        "reference (mlx wheel)",
    ]
    assert found["OpenBLAS 0.3.21, SkylakeX (its own choice)"] == {
        "LD_PRELOAD": "/lib/libblas.so.3",
        bench_blas.CORETYPE: None,
    }
    assert found["OpenBLAS 0.3.21, Haswell (forced)"][bench_blas.CORETYPE] == "Haswell"
    assert found["reference (mlx wheel)"]["LD_PRELOAD"] is None


def test_mkl_runs_with_the_thread_settings_mlx_grpo_gives_it(monkeypatch):
    monkeypatch.setattr(bench_blas, "system_openblas_path", lambda: None)
    monkeypatch.setattr(bench_blas, "pip_mkl_path", lambda: "/venv/lib/libmkl_rt.so.3")
    monkeypatch.delenv("KMP_BLOCKTIME", raising=False)
    ((label, env),) = bench_blas.candidates([], reference=False)
    assert label == "MKL (pip)" and env["LD_PRELOAD"] == "/venv/lib/libmkl_rt.so.3"
    assert env["KMP_BLOCKTIME"] == "0"  # blas.MKL_THREADS, as blas.preload_command sets it
    monkeypatch.setenv("KMP_BLOCKTIME", "200")  # a user's own setting wins, as it does in mlx-grpo
    assert dict(bench_blas.candidates([], reference=False))["MKL (pip)"]["KMP_BLOCKTIME"] == "200"


def _kernels_without_coretype(library: str) -> str:
    """The kernels OpenBLAS picks itself, asked in a fresh process with no OPENBLAS_CORETYPE (not through
    the bench's own_identity, and not in this process, whose first load of the library would fix them)."""
    env = {k: v for k, v in os.environ.items() if k not in (bench_blas.CORETYPE, "LD_PRELOAD")}
    ask = f"from mlx_grpo.blas import openblas_identity; print(openblas_identity({library!r})[1])"
    return subprocess.run(
        [sys.executable, "-c", ask], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_each_candidate_runs_in_its_own_process_with_its_kernels(tmp_path, capsys, monkeypatch):
    system = bench_blas.system_openblas_path()
    if not system or not bench_blas.own_identity(system):
        pytest.skip("no system OpenBLAS to run")
    own = _kernels_without_coretype(system)
    forced = "Haswell" if own.lower() != "haswell" else "SkylakeX"
    if not bench_blas.cpu_flags() >= {"avx2", "fma"}:
        pytest.skip("the CPU cannot run Haswell's kernels")
    # A CORETYPE set by the machine (some set it globally) is not the library's own choice: the bench must
    # neither run nor name it so. Prescott's kernels run on any x86-64 CPU.
    preset = "Prescott" if own.lower() != "prescott" else "Haswell"
    monkeypatch.setenv(bench_blas.CORETYPE, preset)
    path = tmp_path / "blas.json"
    report = bench_blas.main(["--seconds", "0.01", "--cores", forced, "--json", str(path)])
    assert json.loads(path.read_text()) == report
    results = report["results"]
    own_label = next(label for label in results if label.endswith("(its own choice)"))
    forced_label = next(label for label in results if label.endswith("(forced)"))
    # The child names the kernels it ran on: forcing them took effect in that process alone.
    assert own_label.endswith(f"{own} (its own choice)") and results[own_label]["blas"].endswith(
        f"{own} kernels"
    )
    assert results[forced_label]["blas"].endswith(f"{forced} kernels")
    for result in results.values():
        assert set(result["gflops"]) == {name for name, *_ in bench_blas.SHAPES}
        assert all(rate > 0 for rate in result["gflops"].values())
        assert result["max_rel_error"] < 1e-4
    table = capsys.readouterr().err
    assert own_label in table and "32 x 896 x 151936" in table
    assert f"{bench_blas.CORETYPE}={preset} is set here" in table  # the user is told theirs was not run
