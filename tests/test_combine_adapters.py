"""scripts/combine_adapters.py: a weighted sum of runs' LoRA changes, loaded as one adapter."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import combine_adapters  # noqa: E402
from mlx_grpo.models.adapters import prepare_for_training, save_adapters  # noqa: E402
from mlx_grpo.models.loading import load_policy  # noqa: E402


def _adapter_folder(model_path, folder: Path, seed: int, rank: int, scale: float = 20.0) -> Path:
    """A run-like folder with random (non-zero) LoRA on the tiny model, as the trainer saves it."""
    model, _ = load_policy(str(model_path))
    mx.random.seed(seed)
    config = prepare_for_training(
        model, "lora", {"rank": rank, "scale": scale, "dropout": 0.0, "num_layers": -1}
    )
    model.update(
        tree_unflatten(
            [
                (name, mx.random.normal(v.shape) * 0.05)
                for name, v in tree_flatten(model.trainable_parameters())
                if name.endswith("lora_b")
            ]
        )
    )
    save_adapters(model, folder, {**config, "model": str(model_path)})
    (folder / "config.yaml").write_text("task: arith\n")
    return folder


def test_the_combined_adapter_changes_the_model_by_the_weighted_sum(tiny_model_path, tmp_path):
    one = _adapter_folder(tiny_model_path, tmp_path / "one", seed=1, rank=4)
    two = _adapter_folder(tiny_model_path, tmp_path / "two", seed=2, rank=2)
    out = combine_adapters.main([f"{one}:0.5", f"{two}:-2", "--output", str(tmp_path / "sum")])
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["lora_parameters"]["rank"] == 6 and (out / "config.yaml").read_text() == "task: arith\n"

    # Independently: the base's dense weights plus scale * (0.5 A1 B1 - 2 A2 B2), worked out in NumPy.
    base, _ = load_policy(str(tiny_model_path))
    layers = dict(base.named_modules())
    a1, a2 = mx.load(str(one / "adapters.safetensors")), mx.load(str(two / "adapters.safetensors"))
    for name in (n[: -len(".lora_a")] for n in a1 if n.endswith(".lora_a")):
        delta = sum(
            w * np.array(a[name + ".lora_a"]) @ np.array(a[name + ".lora_b"])
            for a, w in ((a1, 0.5), (a2, -2))
        )
        layer = layers[name]
        layer.weight = mx.array(np.array(layer.weight) + 20.0 * delta.T)
    tokens = mx.array([[3, 17, 42, 99, 7, 250]])
    expected = np.array(base(tokens))

    combined, _ = load_policy(str(tiny_model_path), adapter_path=str(out))
    got = np.array(combined(tokens))
    plain, _ = load_policy(str(tiny_model_path))
    assert np.abs(expected - np.array(plain(tokens))).max() > 1e-2  # the change is large enough to see
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-4)


def test_runs_that_do_not_combine_are_refused(tiny_model_path, tmp_path):
    one = _adapter_folder(tiny_model_path, tmp_path / "one", seed=1, rank=4)
    other_scale = _adapter_folder(tiny_model_path, tmp_path / "two", seed=2, rank=4, scale=10.0)
    with pytest.raises(SystemExit):
        combine_adapters.main([str(one), str(other_scale), "--output", str(tmp_path / "sum")])
    with pytest.raises(SystemExit):  # a weight for one run but not the other
        combine_adapters.main([f"{one}:1", str(one), "--output", str(tmp_path / "sum")])
    assert not (tmp_path / "sum").exists()
    combine_adapters.main([str(one), "--output", str(tmp_path / "sum")])
    with pytest.raises(SystemExit):  # never writes over an existing folder
        combine_adapters.main([str(one), "--output", str(tmp_path / "sum")])
