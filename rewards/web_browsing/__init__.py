"""Web browsing on a simulated, fully offline web (see sites.py, tasks.py, env.py).

Public API:

    generate_tasks(n, seed, difficulty=None) -> list[WebTask]
    task.oracle_actions() -> list[str]           a scripted solution
    WebEnv(task): reset() -> str, step(action) -> (observation, done, info), reward() -> float
"""

from .actions import ACTION_HELP, Action, parse_action
from .env import REWARD_WEIGHTS, WebEnv
from .tasks import DIFFICULTIES, FAMILIES, WebTask, generate_tasks, make_task, task_from_row

__all__ = ["ACTION_HELP", "Action", "DIFFICULTIES", "FAMILIES", "REWARD_WEIGHTS", "WebEnv", "WebTask",
           "generate_tasks", "make_task", "parse_action", "task_from_row"]
