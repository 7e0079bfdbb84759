"""The Python API: what the CLI does, step by step, for notebooks and scripts.

Everything here is exported from `mlx_grpo` under these names, which stay
stable; `mlx-grpo train` is a thin layer over `train`.

Whole runs:

    import mlx_grpo
    result = mlx_grpo.train(steps=5, output="checkpoints/demo")   # what `mlx-grpo train` runs
    mlx_grpo.metrics_table(mlx_grpo.read_metrics(result.run_dir))

Step by step (a `Trainer` holds the policy, task, optimizer and history in memory):

    trainer = mlx_grpo.Trainer(batch_size=4, group_size=4)  # the embedded model, arith task
    row = trainer.task.train_rows[0]
    group = trainer.sample(row["prompt"])         # G completions of one prompt
    scores = trainer.score(row, group)            # their rewards
    trainer.update([row], group, scores)          # one optimizer step on the group, shaped as train's
    trainer.step()                                # or one whole GRPO step: sample, score, update
    trainer.metrics()                             # a DataFrame with pandas, else a list of dicts
    trainer.plot()                                # a matplotlib figure (inline in a notebook)

The examples in the docstrings below run as doctests (tests/test_api.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .config import ConfigError, TrainConfig, build_config, with_settings
from .models.adapters import save_adapters
from .models.heap import (
    keep_freed_memory,
)  # the process-wide allocator setting `mlx-grpo` makes; only when asked
from .models.loading import load_policy
from .run import trainer as _trainer
from .run.setup import setup
from .run.step_update import apply_update, kept_groups, prepare_update
from .run.trainer import RunResult
from .sampling.rollout import Completion, SamplingConfig, sample_completions
from .run import task_setup as run_task_setup
from .tasks.data import columns_of, encode_prompt
from .tasks.registry import Task, recommended_settings
from .tasks.rewarding import Scores, score_completions
from .tasks.shaping import step_rewards

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

DEFAULT_PLOT_KEYS = ("reward/mean", "grad_norm", "kl", "completion/mean_length")


def make_config(config_file: str | None = None, **settings) -> TrainConfig:
    """A validated TrainConfig, layered as for `mlx-grpo train`.

    Defaults < the task's recommended settings < `config_file` (YAML) <
    `settings` (the flag names with underscores). Raises ConfigError on a bad value.

    >>> make_config(steps=3, batch_size=2).batch_size
    2
    >>> make_config().task   # the embedded model on the arith task
    'arith'
    """
    return build_config(settings, config_file, task_defaults=recommended_settings)


def load_task(config: TrainConfig) -> Task:
    """The task a config names: its train and held-out rows, reward functions and weights, system prompt.

    >>> task = load_task(make_config(task="arith"))
    >>> task.name, len(task.train_rows) > 0, len(task.reward_functions) == len(task.reward_weights)
    ('arith', True, True)
    """
    return run_task_setup.load_task(config)


def train(
    config: TrainConfig | None = None, on_event: Callable[[str, dict], None] | None = None, **settings
) -> RunResult:
    """A whole training run, exactly what `mlx-grpo train` does (the CLI calls this).

    Give a TrainConfig, or settings for `make_config`. Writes the run folder
    (metrics.jsonl, completions.jsonl, checkpoints, adapters); returns a
    RunResult with the accuracy before and after and the step metrics.
    `on_event(kind, data)` hears "start", "eval", "step", "checkpoint", "end".
    Under `mlx.launch` it trains data-parallel (see distributed.py).

    >>> result = train(steps=2, batch_size=2, group_size=2, output="/tmp/run")  # doctest: +SKIP
    >>> result.summary_line()  # doctest: +SKIP
    'accuracy 0.25 -> 0.30 (+0.05) on 200 held-out problems'
    """
    if config is None:
        config = make_config(**settings)
    elif settings:
        raise TypeError("give either a TrainConfig or settings, not both")
    return _trainer.train(config, on_event)


def sft(
    config: TrainConfig | None = None, on_event: Callable[[str, dict], None] | None = None, **settings
) -> RunResult:
    """Supervised fine-tuning, exactly what `mlx-grpo sft` does (docs/sft.md): on `data` (mlx-lm's
    formats) or on a built-in task's own demonstrations (`task`, its train split). Same settings,
    run folder and RunResult as `train`.

    >>> result = sft(task="arith", steps=80, output="/tmp/sft")  # doctest: +SKIP
    >>> result.summary_line()  # doctest: +SKIP
    """
    from .run.sft import sft as run_sft

    if config is None:
        config = make_config(**settings)
    elif settings:
        raise TypeError("give either a TrainConfig or settings, not both")
    return run_sft(config, on_event)


def sample_group(
    model,
    tokenizer,
    prompt,
    group_size: int = 8,
    *,
    temperature: float | None = None,
    max_tokens: int | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
) -> list[Completion]:
    """`group_size` completions of one prompt (text or chat messages), through its chat template.

    Each Completion keeps the sampled token ids, their behaviour log-probs and
    why it stopped. The same seed gives the same group. A sampling setting left
    None is that setting's default (`mlx-grpo train --help`, docs/settings.md).

    >>> model, tokenizer = load_policy()            # the embedded tiny model
    >>> group = sample_group(model, tokenizer, "What is 2 + 3?", 4, max_tokens=8)
    >>> len(group), group[0].finish_reason in ("stop", "length")
    (4, True)
    """
    model.eval()
    given = dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, max_tokens=max_tokens)
    sampling = SamplingConfig(**{name: value for name, value in given.items() if value is not None})
    return sample_completions(
        model, tokenizer, [encode_prompt(tokenizer, prompt, system_prompt)], group_size, sampling, seed=seed
    )


def score_group(task: Task, row: dict, completions: list[Completion]) -> Scores:
    """Rewards of completions of one data row: `.total` (weighted sum) and `.parts` per function.

    >>> task = load_task(make_config())                # the arith task
    >>> model, tokenizer = load_policy()
    >>> row = task.train_rows[0]
    >>> group = sample_group(model, tokenizer, row["prompt"], 4, system_prompt=task.system_prompt)
    >>> scores = score_group(task, row, group)
    >>> len(scores.total), len(scores.parts) == len(task.reward_functions)  # a value per completion and part
    (4, True)
    """
    n = len(completions)
    return score_completions(
        task.reward_functions,
        task.reward_weights,
        [row["prompt"]] * n,
        [c.text for c in completions],
        columns_of([row], n, completions),
    )


def metrics_table(rows: Iterable[dict]):
    """Step metrics as a pandas DataFrame when pandas is installed, else a list of dicts.

    >>> table = metrics_table([{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.75}])
    >>> len(table)   # rows either way; table["reward/mean"].mean() with pandas
    2
    """
    rows = [dict(r) for r in rows]
    try:
        import pandas as pd
    except ImportError:
        return rows
    return pd.DataFrame(rows)


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The step metrics a run folder recorded (metrics.jsonl), a list of dicts; the held-out
    evaluations before training (step 0, `"before": True`) and at the end (`"final": True`) are
    rows of their own.

    >>> rows = read_metrics("checkpoints/arith-20250101-120000")  # doctest: +SKIP
    >>> rows[-1]["eval/accuracy"]                                 # doctest: +SKIP
    """
    from .evaluation.plot import read_run

    return read_run(run_dir)[0]


def plot_metrics(rows: Iterable[dict], keys: Iterable[str] = DEFAULT_PLOT_KEYS):
    """One small panel per metric against the step; returns the matplotlib Figure.

    Needs matplotlib (`pip install 'mlx-grpo[plot]'`). In a notebook the figure shows inline.

    >>> fig = plot_metrics(trainer.history, ["reward/mean", "grad_norm"])  # doctest: +SKIP
    """
    from .evaluation.plot import series

    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plot_metrics needs matplotlib: pip install 'mlx-grpo[plot]'") from None
    rows, keys = list(rows), list(keys)
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 2.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        steps, values = series(rows, key)
        ax.plot(steps, values, "o-", markersize=3)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


class Trainer:
    """A training run held in memory, one step at a time (no run folder unless you `save`).

    It sets up what `train` sets up (task, policy with adapters, optimizer,
    reference) and runs the same GRPO step. `history` collects each step's
    metrics dict.

    >>> trainer = Trainer(batch_size=2, group_size=4, max_tokens=32)   # embedded model, arith
    >>> metrics = trainer.step()
    >>> metrics["step"], 0.0 <= metrics["reward/mean"] <= 1.0, len(trainer.history)
    (1, True, 1)
    """

    def __init__(self, config: TrainConfig | None = None, **settings):
        self.config = config if config is not None else make_config(**settings)
        if self.config.warm_start.steps > 0:  # the stage needs a run folder of its own (run/warm_start.py)
            raise ConfigError(
                "warm_start_steps: the warm start runs inside train(); for a Trainer, run sft() "
                "first and give its run folder as the model"
            )
        self.run = setup(self.config)  # exactly train()'s setup (run/setup.py)
        self.config = self.run.config  # a run folder as the model: with that run's adapter settings
        self.task, self.model, self.tokenizer = self.run.task, self.run.model, self.run.tokenizer
        self.optimizer, self.adapter_config, self.notes = (
            self.run.optimizer,
            self.run.adapter_config,
            self.run.notes,
        )
        self.step_count = 0
        self.history: list[dict] = []
        self.records: list[dict] = []  # every completion of every step, as in completions.jsonl

    @property
    def ref_params(self):
        """The reference's weights when it is not the base with adapters off (full fine-tuning, refreshes)."""
        return self.run.ref_params

    def sample(self, prompt, group_size: int | None = None, seed: int | None = None) -> list[Completion]:
        """A group of completions of `prompt` with the run's sampling settings and system prompt."""
        c = self.config
        return sample_group(
            self.model,
            self.tokenizer,
            prompt,
            group_size or c.group_size,
            **dataclasses.asdict(c.sampling),
            system_prompt=self.task.system_prompt,
            seed=c.seed + self.step_count if seed is None else seed,
        )

    def score(self, row: dict, completions: list[Completion]) -> Scores:
        """The task's rewards of completions of one data row."""
        return score_group(self.task, row, completions)

    def update(self, rows: list[dict], completions: list[Completion], rewards) -> dict:
        """One step of the run on groups you sampled and scored yourself; returns its metrics.

        `completions` holds len(rows) groups of equal size, at least 2 (the group's mean is each
        one's baseline), group by group (as `sample` returns them, concatenated); `rewards` the
        raw rewards: the Scores `score` returns (concatenated as the groups are), or one number
        each (a weighted total). From there it is `train`'s step: the rewards shaped and the
        groups filtered by the run's settings (tasks/shaping.py's step_rewards: the runaway and
        overlong penalties, `shaping` of side rewards, which needs the Scores' parts when the task
        has several rewards, dynamic_sampling, reward_threshold), then the same advantages,
        truncation mask, token budget, micro-batches and optimizer step (run/step_update.py),
        skipped when no group carries signal (skip_no_signal). Every group the filters keep is
        trained (train's step trains at most batch_size). The groups' own size is the group size
        of this update, whatever the config's. It counts as the run's next step: `history` holds
        its metrics, `reward/mean` over the shaped rewards and `reward/raw_mean` over the raw.
        """
        n = len(completions)
        g = n // max(len(rows), 1)
        if g == 0 or g * len(rows) != n:
            raise ValueError("completions must hold one equal-sized group per row")
        if g < 2:
            raise ValueError(
                "each group needs at least 2 completions: the group's mean is each one's baseline"
            )
        scores = rewards if isinstance(rewards, Scores) else Scores(np.asarray(rewards, dtype=np.float64), {})
        raw = np.asarray(scores.total, dtype=np.float64)
        if raw.shape != (n,):
            raise ValueError(f"rewards must hold one number per completion: {n}, not {raw.size}")
        if not scores.parts and self.config.shaping != "always" and len(self.task.reward_weights) > 1:
            raise ValueError(
                f"shaping {self.config.shaping!r} weighs the side rewards apart from the main one: "
                "pass the Scores that score() returns, not totals"
            )
        config = self.config if g == self.config.group_size else _with_group_size(self.config, g)
        shaped, keep = step_rewards(
            self.task, config, list(completions), scores
        )  # as train's step (shaping.py)
        trained = kept_groups(list(completions), shaped, keep, config)
        self.step_count += 1
        self.model.train()
        ready = prepare_update(self.model, trained, self.task, config, self.step_count, self.ref_params)
        metrics = {
            "step": self.step_count,
            "reward/mean": float(shaped.mean()),
            "reward/raw_mean": float(raw.mean()),
            **apply_update(self.model, self.optimizer, ready, config),
        }
        _trainer.refresh_reference_if_due(self.run, self.step_count, metrics)
        self.history.append(metrics)
        return metrics

    def step(self) -> dict:
        """One GRPO step on the next batch of the task's prompts (as `train` runs it); returns its metrics."""
        self.step_count += 1
        metrics, records = _trainer.run_step(self.run, self.step_count)  # as train() takes its steps
        self.history.append(metrics)
        self.records += records
        return metrics

    def train(self, steps: int) -> list[dict]:
        """`steps` more GRPO steps; returns their metrics."""
        return [self.step() for _ in range(steps)]

    def evaluate(self) -> dict:
        """Accuracy on the task's held-out rows (greedy): {"accuracy", "n", ...}."""
        return _trainer.evaluate(self.model, self.tokenizer, self.task, self.config)

    def metrics(self):
        """The steps' metrics: a pandas DataFrame when pandas is installed, else a list of dicts."""
        return metrics_table(self.history)

    def plot(self, keys: Iterable[str] = DEFAULT_PLOT_KEYS):
        """The steps' metrics, one panel per key (matplotlib Figure)."""
        return plot_metrics(self.history, keys)

    def save(self, folder: str | Path) -> Path:
        """Write the adapters in mlx-lm's format (`mlx_lm.generate --adapter-path FOLDER` loads them)."""
        save_adapters(self.model, Path(folder), self.adapter_config)
        return Path(folder)


def _with_group_size(config: TrainConfig, group_size: int) -> TrainConfig:
    return with_settings(config, group_size=group_size)
