import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A random 2-layer Qwen2 (hidden 32) with a byte-level tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
