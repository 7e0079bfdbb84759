"""mlx-grpo: GRPO-style reinforcement-learning fine-tuning of language models with MLX.

The public Python API (stable names; see mlx_grpo/api.py and the README's
"Python API" section):

    import mlx_grpo
    trainer = mlx_grpo.Trainer(batch_size=4, group_size=4)   # embedded model, arith task
    trainer.step()
    trainer.metrics()

Names are loaded on first use, so `import mlx_grpo` stays light.
"""

__all__ = [
    "Completion",
    "RunResult",
    "SamplingConfig",
    "Scores",
    "Task",
    "TrainConfig",
    "Trainer",
    "keep_freed_memory",
    "load_policy",
    "load_task",
    "make_config",
    "metrics_table",
    "plot_metrics",
    "read_metrics",
    "sample_group",
    "score_group",
    "sft",
    "train",
]


def __getattr__(name):
    if name == "__version__":  # pyproject.toml's, as installed: written down there alone
        from .version import package_version

        return package_version()
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'mlx_grpo' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__, "__version__"])
