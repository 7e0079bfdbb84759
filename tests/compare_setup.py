"""The task and compare settings that `compare` and `eval` build for a model, shared by their test files."""

from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.run.task_setup import load_task


def task_and_settings(
    model, n=12, max_tokens=8, samples=1, temperature=None, task="arith", split="test", **overrides
):
    config = cmp.task_config(
        None, model, {"task": task, "eval_num_problems": n, "max_tokens": max_tokens, **overrides}
    )
    return load_task(config), cmp.build_settings(
        config, split=split, samples=samples, temperature=temperature
    )
