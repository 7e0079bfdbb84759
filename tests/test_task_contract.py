"""The task contract (tasks/contract.py): every built-in task keeps it, and a module that breaks it is
refused in one line naming what is wrong."""

import types

import pytest

from mlx_grpo.config import ConfigError
from mlx_grpo.tasks.contract import TaskModule
from mlx_grpo.tasks.registry import BUILTIN_TASKS, task_module


def _reward(prompts, completions, **columns):
    return [1.0 for _ in completions]


def _module(**attrs):
    module = types.ModuleType("my_task")
    base = {
        "SYSTEM_PROMPT": None,
        "REWARDS": [(_reward, 1.0)],
        "accuracy_reward": _reward,
        "load_rows": lambda split, config: [],
        "recommended_settings": lambda model: {},
    }
    for name, value in {**base, **attrs}.items():
        if value is not ...:  # ...: leave the attribute out
            setattr(module, name, value)
    return module


@pytest.mark.parametrize("name", sorted(BUILTIN_TASKS))
def test_every_built_in_task_keeps_the_contract(name):
    contract = task_module(name)
    assert contract.name == name and callable(contract.load_rows)
    assert all(callable(fn) and isinstance(w, (int, float)) for fn, w in contract.rewards)
    assert (contract.make_env is None) or (contract.episode_factory is None)


def test_a_module_that_keeps_it_is_read_once_into_the_dataclass():
    contract = TaskModule.of(
        _module(
            CHAT_SYSTEM_PROMPT="Answer.",
            CHAT_REWARDS=[(_reward, 0.5)],
            chat_accuracy_reward=_reward,
            READS_DATA=True,
        ),
        "mine",
    )
    assert contract.has_chat_variant and contract.chat_rewards == [(_reward, 0.5)] and contract.reads_data
    assert not TaskModule.of(_module(), "mine").has_chat_variant


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"REWARDS": ...}, "defines no REWARDS"),
        ({"load_rows": ..., "recommended_settings": ...}, "defines no load_rows, recommended_settings"),
        ({"CHAT_SYSTEM_PROMPT": "Answer."}, "a chat variant needs all of"),
        (
            {"make_env": lambda row: None, "episode_factory": lambda *a: None},
            "both make_env and episode_factory",
        ),
        ({"REWARDS": [_reward]}, "not a (reward function, weight) pair"),
        ({"REWARDS": [(_reward, "1")]}, "not a (reward function, weight) pair"),
        ({"accuracy_reward": "right"}, "accuracy_reward is not a function"),
        ({"SYSTEM_PROMPT": 3}, "SYSTEM_PROMPT is not text"),
        ({"READS_DATA": "yes"}, "READS_DATA is not True or False"),
    ],
)
def test_a_broken_contract_is_one_clear_line(attrs, message):
    with pytest.raises(ConfigError, match="task 'mine' \\(my_task\\): ") as e:
        TaskModule.of(_module(**attrs), "mine")
    assert message in str(e.value) and "\n" not in str(e.value)
