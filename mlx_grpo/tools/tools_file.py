"""A task whose rows become tool-calling episodes: `--tools FILE` gives every row the file's functions.

The task's rewards score each episode's final answer (episode.py's ToolEnv); the file is loaded once,
and a file that cannot be loaded is a ConfigError, before any model loads.
"""

from __future__ import annotations

from ..config import ConfigError, TrainConfig
from ..tasks.registry import Task
from .episode import ToolEnv
from .running import ToolsFileError, load_tools


def with_tools_file(task: Task, config: TrainConfig) -> Task:
    """The task, in place, with every row an episode that may call the functions of config.tools."""
    try:
        tools = load_tools(config.tools)
    except ToolsFileError as e:
        raise ConfigError(str(e)) from None
    functions, weights, system_prompt = task.reward_functions, task.reward_weights, task.system_prompt
    task.make_env = lambda row: ToolEnv(
        row, tools, None, functions, weights, system_prompt, config.tool_timeout, config.tool_style
    )
    return task
