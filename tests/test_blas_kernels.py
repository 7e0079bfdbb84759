"""OpenBLAS's kernels follow the CPU: a fallback older than AVX2 is replaced, once, after a matmul check
(blas.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from marks import cpu_backend_only
from mlx_grpo import blas

preloads = cpu_backend_only("the command preloads OpenBLAS only for MLX's CPU backend (blas.preload_command)")

AVX512 = {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx2", "fma", "sse3"}


def test_a_fallback_core_is_replaced_by_the_kernels_the_cpu_can_run():
    assert blas.better_coretype("Prescott", AVX512) == "SkylakeX"
    assert blas.better_coretype("Prescott", {"avx2", "fma", "sse3"}) == "Haswell"
    assert (
        blas.better_coretype("Nehalem", {"avx2", "fma", "avx512f"}) == "Haswell"
    )  # AVX-512F alone: not SkylakeX's set
    assert blas.better_coretype("Sandybridge", {"avx", "sse3"}) is None  # the CPU has nothing better
    for fine in ("Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"):
        assert blas.better_coretype(fine, AVX512) is None


def test_cpu_flags_are_read_from_linux():
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo")
    flags = blas.cpu_flags()
    assert flags and all(" " not in f for f in flags)


def _system_openblas():
    path = blas._SYSTEM_LIB / "x86_64-linux-gnu" / "openblas-pthread" / "libblas.so.3"
    return str(path) if path.is_file() else None


def test_a_coretype_already_set_is_never_changed(monkeypatch):
    library = _system_openblas() or pytest.skip("Debian's OpenBLAS is not installed")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(blas, "on_cpu", lambda: True)
    for name in (blas._DONE, "LD_PRELOAD", blas.CORETYPE, blas._REJECTED):  # some machines set CORETYPE
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(blas.ENV, library)
    monkeypatch.setattr(blas, "openblas_identity", lambda lib: ("0.3.21", "Prescott"))
    monkeypatch.setattr(blas, "cpu_flags", lambda: AVX512)
    _, env = blas.preload_command(["-c", "pass"])
    assert env[blas.CORETYPE] == "SkylakeX" and env[blas._CHOSE] == "0.3.21|Prescott"
    monkeypatch.setenv(blas.CORETYPE, "Haswell")  # the user's (or the machine's) choice
    _, env = blas.preload_command(["-c", "pass"])
    assert env[blas.CORETYPE] == "Haswell" and blas._CHOSE not in env
    monkeypatch.delenv(blas.CORETYPE)
    monkeypatch.setattr(blas, "openblas_identity", lambda lib: None)  # not OpenBLAS (MKL): nothing to choose
    assert blas.CORETYPE not in blas.preload_command(["-c", "pass"])[1]


def test_openblas_names_its_version_and_kernels():
    library = _system_openblas() or pytest.skip("Debian's OpenBLAS is not installed")
    # its own process: its threads
    ask = f"from mlx_grpo import blas; print(*blas.openblas_identity({library!r}))"
    version, core = subprocess.run(
        [sys.executable, "-c", ask], capture_output=True, text=True, check=True
    ).stdout.split()
    assert version.count(".") == 2 and core and core != "?"


def _run_as_if_openblas_chose_prescott(extra: str = "") -> subprocess.CompletedProcess:
    """A real process whose OpenBLAS is made to look like it fell back to Prescott: it re-executes
    with kernels for this CPU, checks them, and reports what MLX's matmuls then run on."""
    library = _system_openblas()
    if library is None:
        pytest.skip("Debian's OpenBLAS is not installed")
    if blas.better_coretype("Prescott", blas.cpu_flags()) is None:
        pytest.skip("this CPU has neither AVX2 nor AVX-512")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", blas._DONE, blas.CORETYPE, blas._CHOSE, blas._REJECTED)
    }
    env[blas.ENV] = library
    code = (
        "from mlx_grpo import blas\n"
        "real = blas.openblas_identity\n"
        "blas.openblas_identity = lambda lib: (real(lib)[0], 'Prescott')\n"
        f"{extra}\n"
        "blas.use_openblas()\n"
        "blas.openblas_identity = real\n"
        "print(blas.blas_description())\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True
    )


@preloads
def test_kernels_that_agree_with_numpy_are_kept_and_named():
    done = _run_as_if_openblas_chose_prescott()
    ours = blas.better_coretype("Prescott", blas.cpu_flags())
    assert done.stdout.strip().endswith(f"{ours} kernels"), done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert (
        f"{ours} kernels for this CPU, not the Prescott kernels" in lines[0]
        and "agrees with NumPy" in lines[0]
    )


@preloads
def test_kernels_that_disagree_go_back_to_the_librarys_choice():
    done = _run_as_if_openblas_chose_prescott("blas.matmul_error = lambda: 1.0")
    ask = f"from mlx_grpo import blas; print(blas.openblas_identity({_system_openblas()!r})[1])"
    # The library's own choice is made without OPENBLAS_CORETYPE (the rejection takes it out); a machine
    # that sets it globally would otherwise name its kernels here.
    env = {k: v for k, v in os.environ.items() if k not in (blas.CORETYPE, "LD_PRELOAD")}
    own = subprocess.run(
        [sys.executable, "-c", ask], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert done.stdout.strip().endswith(f"{own} kernels"), done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "disagreed with NumPy" in lines[0], done.stderr


def test_mlx_matmul_agrees_with_numpy_here():
    assert blas.matmul_error() < 1e-4
