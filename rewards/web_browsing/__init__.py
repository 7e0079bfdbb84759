"""Web browsing on a simulated, fully offline web (see world.py, sites.py, tasks.py, env.py).

Public API:

    generate_tasks(n, seed, difficulty=None) -> list[WebTask]
    task.oracle_actions() -> list[str]           a scripted solution
    WebEnv(task): reset() -> str, step(action) -> (observation, done, info), reward() -> float

It is also the multi-turn task `mlx-grpo train --task web` (training.py).
"""

from .actions import ACTION_HELP, Action, parse_action
from .env import REWARD_WEIGHTS, WebEnv
from .tasks import DIFFICULTIES, FAMILIES, WebTask, generate_tasks, make_task, task_from_row

# The task protocol of mlx_grpo/tasks/registry.py: `mlx-grpo train --task web`.
from .training import (
    READS_DATA,
    REWARDS,
    SYSTEM_PROMPT,
    accuracy_reward,
    load_rows,
    episode_factory,
    recommended_settings,
    reference_actions,
)

__all__ = [
    "ACTION_HELP",
    "Action",
    "DIFFICULTIES",
    "FAMILIES",
    "REWARD_WEIGHTS",
    "WebEnv",
    "WebTask",
    "generate_tasks",
    "make_task",
    "parse_action",
    "task_from_row",
    # The task protocol of mlx_grpo/tasks/registry.py: `mlx-grpo train --task web`.
    "READS_DATA",
    "REWARDS",
    "SYSTEM_PROMPT",
    "accuracy_reward",
    "load_rows",
    "episode_factory",
    "recommended_settings",
    "reference_actions",
]
