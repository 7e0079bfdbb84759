"""The command names the slow BLAS once, with the fix (blas.slow_blas_notice, use_openblas)."""

import os
import subprocess
import sys

import pytest

from marks import cpu_backend_only
from mlx_grpo import blas


@pytest.fixture()
def linux_cpu(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(blas, "on_cpu", lambda: True)
    monkeypatch.delenv(blas.ENV, raising=False)


def test_the_notice_names_the_case_and_the_fix(linux_cpu, monkeypatch, tmp_path):
    monkeypatch.setattr(blas, "loaded_blas", lambda: "reference")
    notice = blas.slow_blas_notice()
    assert (
        notice.startswith("warning: no OpenBLAS or MKL found")
        and "apt-get install libopenblas0-pthread" in notice
    )
    assert "pip install 'mlx-grpo[fastblas]'" in notice
    monkeypatch.setenv(blas.ENV, str(tmp_path / "missing.so"))
    notice = blas.slow_blas_notice()
    assert f"{blas.ENV}={tmp_path / 'missing.so'} is not a file" in notice and "\n" not in notice
    monkeypatch.setenv(blas.ENV, "0")  # turned off on purpose: no nagging
    assert blas.slow_blas_notice() is None


def test_no_notice_when_the_matmuls_are_not_on_the_reference_blas(linux_cpu, monkeypatch):
    for loaded in ("openblas", "mkl", "platform"):
        monkeypatch.setattr(blas, "loaded_blas", lambda loaded=loaded: loaded)
        assert blas.slow_blas_notice() is None
    monkeypatch.setattr(blas, "loaded_blas", lambda: "reference")
    monkeypatch.setattr(blas, "on_cpu", lambda: False)  # a GPU backend
    assert blas.slow_blas_notice() is None
    monkeypatch.setattr(blas, "on_cpu", lambda: True)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert blas.slow_blas_notice() is None


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the wheel's reference BLAS is a Linux matter"
)
@cpu_backend_only(
    "the notice is about MLX's CPU matmuls, so it is said only on the CPU backend (blas.slow_blas_notice)"
)
def test_a_process_left_on_the_reference_blas_says_so_once(tmp_path):
    """A real process: MLX_GRPO_OPENBLAS names a missing file, so the wheel's BLAS is what MLX maps."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", blas._DONE)}
    env[blas.ENV] = str(tmp_path / "nope.so")
    code = "from mlx_grpo.blas import use_openblas, loaded_blas; use_openblas(); print(loaded_blas())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    if done.stdout.strip() != "reference":
        pytest.skip(f"this MLX does not bring the reference BLAS ({done.stdout.strip()})")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "is not a file" in lines[0] and "reference BLAS" in lines[0]


def test_the_system_openblas_comes_first_then_mkl_from_pip(monkeypatch, tmp_path):
    """blas_path: MLX_GRPO_OPENBLAS, else Debian's OpenBLAS, else the mkl wheel's libmkl_rt (x86-64)."""
    import platform

    monkeypatch.delenv(blas.ENV, raising=False)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    system, env = tmp_path / "usr" / "lib", tmp_path / "venv"
    monkeypatch.setattr(blas, "_SYSTEM_LIB", system)
    monkeypatch.setattr(
        blas.sysconfig, "get_path", lambda name, scheme=None: str(env) if scheme is None else None
    )
    assert blas.blas_path() is None  # nothing installed
    (env / "lib").mkdir(parents=True)
    for name in ("libmkl_rt.so.2", "libmkl_rt.so.3", "libmkl_core.so.3"):
        (env / "lib" / name).write_bytes(b"")
    assert blas.blas_path() == str(env / "lib" / "libmkl_rt.so.3")  # the newest runtime the wheel left
    openblas = system / "x86_64-linux-gnu" / "openblas-pthread" / "libblas.so.3"
    openblas.parent.mkdir(parents=True)
    openblas.write_bytes(b"")
    assert blas.blas_path() == str(openblas)
    monkeypatch.setenv(blas.ENV, str(env / "lib" / "libmkl_rt.so.2"))  # named: that one
    assert blas.blas_path() == str(env / "lib" / "libmkl_rt.so.2")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(blas, "on_cpu", lambda: True)
    monkeypatch.delenv(blas._DONE, raising=False)
    monkeypatch.delenv("KMP_BLOCKTIME", raising=False)
    argv, child = blas.preload_command(["-c", "pass"])
    assert child["LD_PRELOAD"].split(":")[0] == str(env / "lib" / "libmkl_rt.so.2")
    assert child["KMP_BLOCKTIME"] == "0"  # MKL's OpenMP threads do not spin between calls
    monkeypatch.setenv("KMP_BLOCKTIME", "200")  # unless the user says otherwise
    assert blas.preload_command(["-c", "pass"])[1]["KMP_BLOCKTIME"] == "200"
    monkeypatch.setenv(blas.ENV, "0")
    assert blas.blas_path() is None
    monkeypatch.delenv(blas.ENV)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")  # Intel's wheel does not exist there
    openblas.unlink()
    assert blas.blas_path() is None


@pytest.mark.skipif(blas.pip_mkl_path() is None, reason="the mkl wheel (extra fastblas) is not installed")
@cpu_backend_only("the command preloads a BLAS only for MLX's CPU backend (blas.preload_command)")
def test_mkl_from_pip_runs_mlx_matmuls(tmp_path):
    """A real process preloads the wheel's libmkl_rt: MLX maps it, says nothing, and its matmul is NumPy's."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", blas._DONE)}
    env[blas.ENV] = blas.pip_mkl_path()
    code = (
        "from mlx_grpo.blas import use_openblas, loaded_blas; use_openblas()\n"
        "import mlx.core as mx, numpy as np\n"
        "a = np.random.default_rng(0).standard_normal((300, 200), dtype=np.float32)\n"
        "b = np.random.default_rng(1).standard_normal((200, 100), dtype=np.float32)\n"
        "got = np.array(mx.matmul(mx.array(a), mx.array(b), stream=mx.cpu))\n"
        "want = a.astype(np.float64) @ b.astype(np.float64)\n"
        "print(loaded_blas(), float(np.abs(got - want).max()))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    loaded, error = done.stdout.split()
    assert loaded == "mkl" and float(error) < 1e-3, done.stdout
    assert "warning" not in done.stderr, done.stderr
