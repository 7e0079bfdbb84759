import json
import os
import sys
from pathlib import Path

# On MLX's CUDA backend float32 matmuls default to TF32 (inputs rounded to 10 mantissa bits, about
# 1e-3 relative), so two correct computations of one log-prob (a decode step and a forward pass, a
# whole and a chunked gradient) differ by ~1e-3, above the float32 tolerances these tests hold. The
# CPU and Metal backends multiply float32 in full float32; with TF32 off CUDA does too, and every
# test keeps one standard on every backend. MLX reads this at its first matmul; subprocesses inherit it.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from tiny import build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A random 2-layer Qwen2 (hidden 32) with a byte-level tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture()
def cpu_device():
    """MLX's CPU device as the default for one test, on a GPU machine too: for a test of what the product
    computes or decides on the CPU backend (its own exp, the float32 copy of a quantized base, the CPU's
    activation budget), which a GPU default would turn into another test. Where the CPU is the default
    already (CI), it changes nothing."""
    device = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield mx.cpu
    mx.set_default_device(device)


@pytest.fixture()
def float64_device(cpu_device):
    """float64 exists only on MLX's CPU backend: a test that needs it runs there, on a GPU machine too."""
    return cpu_device


@pytest.fixture
def gguf_cache(tmp_path, monkeypatch):
    """A fresh folder for converted GGUF models, so no test reads another's (or the user's) cache."""
    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def answer_cache_of_its_own(tmp_path, monkeypatch):
    """eval and compare keep answers between runs (evaluation/answer_cache.py): each test starts with none,
    so no test reads answers another test (or the user) decoded."""
    monkeypatch.setenv("MLX_GRPO_ANSWER_CACHE", str(tmp_path / "answers"))


@pytest.fixture
def variety_task(tmp_path):
    """A custom task for tiny runs: 40 "say i" prompts and a reward for distinct characters, as flags."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(40)))
    rewards = tmp_path / "rewards.py"
    rewards.write_text(
        "def variety(prompts, completions, **kw):\n    return [len(set(c)) / 10 for c in completions]\n"
    )
    return dict(data=str(data), reward_file=str(rewards), reward=["variety"])
