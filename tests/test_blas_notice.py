"""The command names the slow BLAS once, with the fix (blas.slow_blas_notice, use_openblas)."""

import os
import subprocess
import sys

import pytest

from mlx_grpo import blas


@pytest.fixture()
def linux_cpu(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(blas, "_mlx_on_cpu", lambda: True)
    monkeypatch.delenv(blas.ENV, raising=False)


def test_the_notice_names_the_case_and_the_fix(linux_cpu, monkeypatch, tmp_path):
    monkeypatch.setattr(blas, "loaded_blas", lambda: "reference")
    notice = blas.slow_blas_notice()
    assert notice.startswith("warning: no OpenBLAS found") and "apt-get install libopenblas0-pthread" in notice
    monkeypatch.setenv(blas.ENV, str(tmp_path / "missing.so"))
    notice = blas.slow_blas_notice()
    assert f"{blas.ENV}={tmp_path / 'missing.so'} is not a file" in notice and "\n" not in notice
    monkeypatch.setenv(blas.ENV, "0")  # turned off on purpose: no nagging
    assert blas.slow_blas_notice() is None


def test_no_notice_when_the_matmuls_are_not_on_the_reference_blas(linux_cpu, monkeypatch):
    for loaded in ("openblas", "platform"):
        monkeypatch.setattr(blas, "loaded_blas", lambda loaded=loaded: loaded)
        assert blas.slow_blas_notice() is None
    monkeypatch.setattr(blas, "loaded_blas", lambda: "reference")
    monkeypatch.setattr(blas, "_mlx_on_cpu", lambda: False)  # a GPU backend
    assert blas.slow_blas_notice() is None
    monkeypatch.setattr(blas, "_mlx_on_cpu", lambda: True)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert blas.slow_blas_notice() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the wheel's reference BLAS is a Linux matter")
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
