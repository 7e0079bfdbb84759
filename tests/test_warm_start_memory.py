"""The warm start's model is gone when GRPO loads its own: the command's peak is the larger stage's."""

import weakref

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from mlx_grpo.config import build_config
from mlx_grpo.models.random_model import BYTE_VOCAB, build_random_model
from mlx_grpo.run import sft as sft_module
from mlx_grpo.run import trainer
from mlx_grpo.tasks.registry import recommended_settings


class GRPOSetUp(Exception):
    pass


def test_nothing_of_the_warm_start_s_model_is_left_when_grpo_loads(tmp_path, monkeypatch):
    # A few MB of float32 weights, so that a model still held shows in the active memory.
    model = build_random_model(
        tmp_path / "model", hidden=256, layers=2, heads=4, kv_heads=2, intermediate=512, vocab=BYTE_VOCAB
    )
    config = build_config(
        {
            "task": "arith",
            "model": str(model),
            "output": str(tmp_path / "run"),
            "steps": 1,
            "batch_size": 2,
            "group_size": 2,
            "lora_rank": 4,
            "max_tokens": 8,
            "eval_before": False,
            "eval_num_problems": 2,  # the stage's check after its step decodes: compiled steps hold its model
            "warm_start_steps": 1,
            "warm_start_batch_size": 2,
        },
        task_defaults=recommended_settings,
    )
    held, seen = {}, {}
    real_setup = sft_module.sft_setup

    def recording_setup(*args, **kwargs):
        run = real_setup(*args, **kwargs)
        held["model"] = weakref.ref(run.model)
        held["bytes"] = sum(v.nbytes for _, v in tree_flatten(run.model.parameters()))
        return run

    def grpo_setup(*args, **kwargs):  # where GRPO would load its model: look, then stop the run
        seen["alive"] = held["model"]() is not None
        seen["active"], seen["cache"] = mx.get_active_memory(), mx.get_cache_memory()
        raise GRPOSetUp

    monkeypatch.setattr(sft_module, "sft_setup", recording_setup)
    monkeypatch.setattr(trainer, "setup", grpo_setup)
    mx.clear_cache()
    active_before = mx.get_active_memory()
    with pytest.raises(GRPOSetUp):
        trainer.train(config)
    assert (tmp_path / "run" / "warm_start" / "summary.json").is_file()  # the stage ran to its end
    assert not seen["alive"]
    assert seen["cache"] == 0
    assert seen["active"] - active_before < held["bytes"] / 4, (seen, active_before, held["bytes"])
