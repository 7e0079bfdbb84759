"""What a task module provides: the contract between a domain in `rewards/` and the engine, written once.

A built-in task is a Python module (registered in registry.BUILTIN_TASKS). `TaskModule.of(module)`
reads it once, when the task loads, and refuses a module that breaks the contract in one line naming
what is wrong; the rest of the engine reads the dataclass, never the module.

A task module must define:

    SYSTEM_PROMPT: str | None                        the embedded model's instructions (None: none)
    REWARDS: list[tuple[reward_fn, weight]]          reward functions and their weights ([] for a task
                                                     whose environment scores its episodes)
    accuracy_reward(prompts, completions, **columns) 1.0 = right; None where episodes are scored whole
    load_rows(split, config) -> list[dict] | None    "train", "validation" or "test"; None hands --data
                                                     to the generic loader; [] for a split it lacks
    recommended_settings(model) -> dict              settings below the YAML file and the flags

and may define:

    CHAT_SYSTEM_PROMPT, CHAT_REWARDS, chat_accuracy_reward   all three or none: the variant every model
                                                     but the embedded one gets (registry.is_chat_model)
    make_env(row) -> Environment                     a multi-turn task: its episodes
    episode_factory(config, functions, weights, system_prompt) -> make_env
                                                     a multi-turn task whose environment needs the run's
                                                     settings and rewards (one of make_env, episode_factory)
    READS_DATA: bool                                 the task reads --data itself (load_rows)
    reference_answer(row) -> str | None              a known-good answer (--guide, sft)
    reference_actions(row) -> list[str]              a scripted episode's actions (--guide, sft)

A reward function follows the widespread shape `fn(prompts, completions, **columns) -> list[float | None]`.
docs/add-a-task.md walks through a new task from its rows to `compare`.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import Callable

from ..errors import ConfigError

REQUIRED = ("SYSTEM_PROMPT", "REWARDS", "accuracy_reward", "load_rows", "recommended_settings")
CHAT_VARIANT = ("CHAT_SYSTEM_PROMPT", "CHAT_REWARDS", "chat_accuracy_reward")


@dataclass(frozen=True)
class TaskModule:
    """A task module's contract, checked (TaskModule.of)."""

    name: str
    system_prompt: str | None
    rewards: list[tuple[Callable, float]]
    accuracy_reward: Callable | None
    load_rows: Callable
    recommended_settings: Callable
    chat_system_prompt: str | None = None
    chat_rewards: list[tuple[Callable, float]] | None = None
    chat_accuracy_reward: Callable | None = None
    make_env: Callable | None = None
    episode_factory: Callable | None = None
    reads_data: bool = False
    reference_answer: Callable | None = None
    reference_actions: Callable | None = None

    @property
    def has_chat_variant(self) -> bool:
        return self.chat_rewards is not None

    @classmethod
    def of(cls, module, name: str) -> TaskModule:
        """The contract of `module` (task `name`); ConfigError in one line when it is broken."""

        def fail(what: str):
            raise ConfigError(f"task {name!r} ({module.__name__}): {what} (see mlx_grpo/tasks/contract.py)")

        missing = [attr for attr in REQUIRED if not hasattr(module, attr)]
        if missing:
            fail(f"defines no {', '.join(missing)}")
        chat = [attr for attr in CHAT_VARIANT if hasattr(module, attr)]
        if chat and len(chat) < len(CHAT_VARIANT):
            fail(f"a chat variant needs all of {', '.join(CHAT_VARIANT)}; it has only {', '.join(chat)}")
        if hasattr(module, "make_env") and hasattr(module, "episode_factory"):
            fail("defines both make_env and episode_factory; one of them")
        values = {
            attr: getattr(module, attr, None)
            for attr in (
                *REQUIRED,
                *CHAT_VARIANT,
                "make_env",
                "episode_factory",
                "reference_answer",
                "reference_actions",
            )
        }
        for attr in ("load_rows", "recommended_settings"):
            if not callable(values[attr]):
                fail(f"{attr} is not a function")
        for attr in (
            "accuracy_reward",
            "chat_accuracy_reward",
            "make_env",
            "episode_factory",
            "reference_answer",
            "reference_actions",
        ):
            if values[attr] is not None and not callable(values[attr]):
                fail(f"{attr} is not a function")
        for attr in ("SYSTEM_PROMPT", "CHAT_SYSTEM_PROMPT"):
            if values[attr] is not None and not isinstance(values[attr], str):
                fail(f"{attr} is not text")
        _check_rewards(values["REWARDS"], "REWARDS", fail)
        if chat:  # all three, checked above
            _check_rewards(values["CHAT_REWARDS"], "CHAT_REWARDS", fail)
        reads_data = getattr(module, "READS_DATA", False)
        if not isinstance(reads_data, bool):
            fail("READS_DATA is not True or False")
        return cls(
            name,
            values["SYSTEM_PROMPT"],
            list(values["REWARDS"]),
            values["accuracy_reward"],
            values["load_rows"],
            values["recommended_settings"],
            values["CHAT_SYSTEM_PROMPT"],
            list(values["CHAT_REWARDS"]) if chat else None,
            values["chat_accuracy_reward"],
            values["make_env"],
            values["episode_factory"],
            reads_data,
            values["reference_answer"],
            values["reference_actions"],
        )


def _check_rewards(rewards, attr: str, fail) -> None:
    if not isinstance(rewards, (list, tuple)):
        fail(f"{attr} is not a list of (reward function, weight) pairs")
    for pair in rewards:
        if not (
            isinstance(pair, tuple) and len(pair) == 2 and callable(pair[0]) and isinstance(pair[1], Real)
        ):
            fail(f"{attr} holds {pair!r}, not a (reward function, weight) pair")
