"""The CPU's exp, log-sum-exp and SwiGLU (models/cpu_math.py) against NumPy in float64 and against
MLX's own ops: values, gradients, the ends of the range, and the MLP swap that puts SwiGLU into
mlx-lm's model classes without changing what they compute."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import qwen2

from mlx_grpo.models import cpu_math
from mlx_grpo.models.loading import load_policy

# Off the CPU these functions are MLX's own ops (whose exp, for one, is not clamped at -87 and 88): every
# test here runs on the CPU device, so that it tests the CPU's code on a GPU machine too.
pytestmark = pytest.mark.usefixtures("cpu_device")

# float32 rounds x * log2(e) by up to half an ulp of the product, which moves e^x by that many
# ulps of |x| / 0.69 (MLX's own exp does the same): bound the error near 0 tightly, and far from
# 0 relative to the rounding of the input.
_NEAR_ZERO = 3e-7


def test_exp_matches_numpy_near_zero_and_within_input_rounding_far_from_it():
    rng = np.random.default_rng(0)
    near = rng.uniform(-2, 2, 100_000).astype(np.float32)
    far = rng.uniform(-86, 87, 100_000).astype(np.float32)
    got_near = np.array(cpu_math.exp(mx.array(near))).astype(np.float64)
    exact_near = np.exp(near.astype(np.float64))
    assert np.max(np.abs(got_near - exact_near) / exact_near) < _NEAR_ZERO
    got_far = np.array(cpu_math.exp(mx.array(far))).astype(np.float64)
    exact_far = np.exp(far.astype(np.float64))
    allowed = _NEAR_ZERO + np.abs(far) * 2.0**-24 * 2  # two ulps of the rounded product, with margin
    assert np.all(np.abs(got_far - exact_far) / exact_far < allowed)


def test_exp_at_the_ends_of_its_range():
    got = np.array(cpu_math.exp(mx.array([-mx.inf, -100.0, -87.0, 0.0, 88.0, 100.0, mx.inf, mx.nan])))
    floor, ceiling = np.exp(np.float64(-87)), np.exp(np.float64(88))
    np.testing.assert_allclose(
        got[:3], floor, rtol=1e-5
    )  # clamped to e^-87 (within input rounding), not garbage
    assert got[3] == 1.0
    np.testing.assert_allclose(got[4:7], ceiling, rtol=1e-5)
    assert np.isnan(got[7])


def test_exp_gradient_is_exp():
    x = np.linspace(-20, 20, 401, dtype=np.float32)
    grad = mx.grad(lambda v: (cpu_math.exp(v) * mx.arange(401)).sum())(mx.array(x))
    expected = np.exp(x.astype(np.float64)) * np.arange(401)
    np.testing.assert_allclose(np.array(grad), expected, rtol=_NEAR_ZERO + 20 * 2.0**-24 * 2)


def test_exp_keeps_half_precision_dtypes():
    x = mx.array([0.5, -3.0, 7.0], dtype=mx.bfloat16)
    got = cpu_math.exp(x)
    assert got.dtype == mx.bfloat16
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.exp([0.5, -3.0, 7.0]), rtol=1e-2)


@pytest.mark.parametrize("keepdims", [False, True])
def test_logsumexp_matches_numpy(keepdims):
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(5, 3000)) * 20).astype(np.float32)
    x[0, :2999] = -np.inf  # one finite entry: its value
    x64 = x.astype(np.float64)
    top = x64.max(axis=-1, keepdims=True)
    expected = np.log(np.exp(x64 - top).sum(axis=-1, keepdims=True)) + top
    got = np.array(cpu_math.logsumexp(mx.array(x), axis=-1, keepdims=keepdims))
    assert got.shape == (expected.shape if keepdims else expected.shape[:-1])
    np.testing.assert_allclose(got.reshape(-1), expected.reshape(-1), rtol=1e-6)


def _numpy_swiglu_and_gradient(gate, x):
    g = gate.astype(np.float64)
    s = 1 / (1 + np.exp(-g))
    return g * s * x, s * (1 + g * (1 - s)) * x  # value, d value / d gate


def test_swiglu_and_its_gradients_match_numpy():
    rng = np.random.default_rng(2)
    gate = (rng.normal(size=(4, 64)) * 6).astype(np.float32)
    x = rng.normal(size=(4, 64)).astype(np.float32)
    value, d_gate = _numpy_swiglu_and_gradient(gate, x.astype(np.float64))
    np.testing.assert_allclose(
        np.array(cpu_math.swiglu(mx.array(gate), mx.array(x))), value, rtol=1e-5, atol=1e-6
    )
    grad_gate, grad_x = mx.grad(lambda g, v: cpu_math.swiglu(g, v).sum(), argnums=(0, 1))(
        mx.array(gate), mx.array(x)
    )
    np.testing.assert_allclose(np.array(grad_gate), d_gate, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(grad_x), value / x, rtol=1e-5, atol=1e-6)


def _mlp(cls, hidden=16, intermediate=40, seed=0):
    """An instance of an mlx-lm MLP class, whatever its constructor takes."""
    mx.random.seed(seed)
    mlp = cls.__new__(cls)
    nn.Module.__init__(mlp)
    mlp.gate_proj = nn.Linear(hidden, intermediate, bias=False)
    mlp.up_proj = nn.Linear(hidden, intermediate, bias=False)
    mlp.down_proj = nn.Linear(intermediate, hidden, bias=False)
    return mlp


@pytest.mark.parametrize("cls", cpu_math._plain_swiglu_mlps(), ids=lambda c: c.__module__)
def test_swapped_mlp_computes_what_mlx_lms_computes(cls):
    mlp = _mlp(cls)
    x = mx.random.normal((3, 5, 16)) * 3
    before = np.array(mlp(x))
    names = [k for k, _ in tree_flatten(mlp.parameters())]
    holder = nn.Module()
    holder.mlp = mlp
    assert cpu_math.use_fast_swiglu(holder) == 1
    assert type(mlp) is not cls and isinstance(mlp, cls) and type(mlp).__name__ == cls.__name__
    assert [k for k, _ in tree_flatten(mlp.parameters())] == names
    np.testing.assert_allclose(np.array(mlp(x)), before, rtol=1e-5, atol=1e-6)
    swapped = type(mlp)
    assert cpu_math.use_fast_swiglu(holder) == 0 and type(mlp) is swapped  # a second call changes nothing


def test_loaded_policy_uses_it_and_other_models_of_its_class_do_not(tiny_model_path):
    policy, _ = load_policy(str(tiny_model_path))
    mlps = [m for _, m in policy.named_modules() if isinstance(m, qwen2.MLP)]
    assert mlps and all(type(m) is not qwen2.MLP for m in mlps)
    untouched = _mlp(qwen2.MLP)
    assert type(untouched) is qwen2.MLP
