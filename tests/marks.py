"""Skip marks for what a machine lacks or deliberately does otherwise, each condition written once."""

import mlx.core as mx
import pytest

from mlx_grpo.device import on_cpu
from rewards import ocaml

needs_ocaml = pytest.mark.skipif(ocaml.toolchain_path() is None, reason=ocaml.INSTALL_HINT)


def cpu_backend_only(why: str):
    """Skip where MLX's default device is not the CPU, since there the product does otherwise on purpose
    (`why` says what). A test of a computation that is the CPU's whatever the machine takes the
    `cpu_device` fixture (conftest.py) instead, and runs there."""
    return pytest.mark.skipif(not on_cpu(), reason=f"MLX's default device is {mx.default_device()}: {why}")
