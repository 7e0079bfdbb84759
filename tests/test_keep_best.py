"""keep_best: the final weights, evaluated after the last step, can be the best checkpoint."""

import json

import numpy as np
import pytest

from mlx_grpo.config import build_config
from mlx_grpo.run import checkpoint as ckpt
from mlx_grpo.run import run_result, trainer


@pytest.mark.parametrize("final, best", [(0.9, "step_000003"), (0.05, "step_000002")])
def test_keep_best_compares_the_final_evaluation_too(tmp_path, monkeypatch, final, best):
    """Accuracy 0.1 before, 0.2 and 0.3 at steps 1 and 2 (eval_steps 1), then `final` after step 3:
    the best checkpoint is the one whose evaluation is highest, the final weights included."""
    accuracies = iter([0.1, 0.2, 0.3, final])
    monkeypatch.setattr(
        run_result, "evaluate", lambda *a: {"accuracy": next(accuracies), "n": 4, "seconds": 0.0}
    )
    config = build_config(
        {
            "steps": 3,
            "batch_size": 2,
            "group_size": 2,
            "max_tokens": 8,
            "eval_steps": 1,
            "keep_best": True,
            "keep_checkpoints": 1,
            "output": str(tmp_path / "run"),
        }
    )
    result = trainer.train(config)
    folder = ckpt.best_checkpoint(result.run_dir)
    assert folder.name == best and (result.run_dir / "checkpoints" / "best").read_text().strip() == best
    assert json.loads((folder / "state.json").read_text())["eval_metric"] == max(0.3, final)
    # the final checkpoint holds the final weights (adapters.safetensors beside the run is written from them)
    import mlx.core as mx

    last = mx.load(str(result.run_dir / "checkpoints" / "step_000003" / "adapters.safetensors"))
    saved = mx.load(str(result.run_dir / "adapters.safetensors"))
    assert all(np.array_equal(np.array(last[k]), np.array(saved[k])) for k in saved)
