"""The task as `train`, `eval`, `compare` and the API use it: the task itself, then the judge and the tools.

tasks/registry.py builds a task from its module or data and checks every setting; the two additions a
flag brings live here, above the floors they come from: a judge model grading answers beside the task's
rewards (--judge, rewards/judge.py, which samples with mlx_grpo.sampling) and a file of tools that makes
each row a tool-calling episode (--tools, mlx_grpo/tools/tools_file.py).
"""

from __future__ import annotations

from ..config import ConfigError, TrainConfig
from ..tasks.registry import JUDGE_RUBRICS, Task, base_task
from ..tasks.rewarding import RewardFn
from ..tools.tools_file import with_tools_file


def load_task(config: TrainConfig) -> Task:
    """The task with the judge (--judge) as a last reward and a tools file's episodes (--tools)."""
    task = base_task(config)
    if config.judge:
        rows = task.train_rows + task.eval_rows + task.test_rows
        task.reward_functions = [*task.reward_functions, _judge(config, rows, JUDGE_RUBRICS.get(config.task))]
        task.reward_weights = [*task.reward_weights, config.judge_weight]
    if config.tools:  # every row a tool-calling episode, scored by the task's rewards on its final answer
        with_tools_file(task, config)
    return task


def _judge(config: TrainConfig, rows: list[dict], default_rubric: str | None) -> RewardFn:
    """The judge reward (rewards/judge.py); a rubric or judge that cannot work is a ConfigError, before
    training."""
    from rewards.judge import JudgeError, load_rubric, make_judge_reward

    try:
        rubric = load_rubric(config.judge_rubric or default_rubric)
        missing = next((c for c in rubric.columns if any(c not in r for r in rows)), None)
        if missing:
            raise ConfigError(
                f"rubric {rubric.name} names {{{missing}}}, but the data has no {missing!r} column "
                "in every row"
            )
        return make_judge_reward(
            config.judge, rubric, concurrency=config.decode_concurrency, keep_quantized=config.keep_quantized
        )
    except JudgeError as e:
        raise ConfigError(str(e)) from None
