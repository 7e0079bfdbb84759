"""Tasks: where prompts come from, how they are scored, what accuracy means.

Each domain lives in the `rewards` package (its data or generator, prompt
format and reward functions); this module only gathers what the trainer needs
from it. `--data` replaces a task's prompts and `--reward-file/--reward`
replace its rewards, so any mlx-lm model can be trained on any JSONL.

A built-in task is a module in `rewards` (registered in BUILTIN_TASKS); what it must and may
define is written once, in tasks/contract.py, and checked when the task loads. Every model but
the embedded one gets a task's chat variant (see `is_chat_model`).

The judge (--judge) and a tools file (--tools) are added above this floor, by
run/task_setup.py's load_task: this module builds the task as its module and data define it.

A task's recommended_settings gives chat models CHAT_SYSTEM_PROMPT as their
`system_prompt` setting, so a run's config.yaml records the prompt it trained with.

A base model (one whose files carry no chat template, see `is_base_model`) is
scored as a chat model but has no template to carry instructions: a task may
recommend it a plain-text `prompt_format` (a few worked examples, then the
prompt) and `stop` strings that end the answer, since a base model rarely
writes an end-of-text token. RL from such a start is the "zero" setting.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

from ..config import ConfigError, TrainConfig
from .curriculum import Curriculum
from .data import DataError, load_rows
from .contract import TaskModule
from .rewarding import RewardFn, load_reward_functions, reward_name
from .splits import split_held_out

BUILTIN_TASKS = {
    "arith": "rewards.arith",
    "gsm8k": "rewards.gsm8k",
    "web": "rewards.web_browsing",
    "ocaml": "rewards.ocaml",
    "multihop": "rewards.multihop",
}
TASKS = (*BUILTIN_TASKS, "custom")
# The rubric --judge uses when none is given (rewards/rubrics/); other tasks: "general".
JUDGE_RUBRICS = {"ocaml": "ocaml_quality"}


@dataclass
class Task:
    name: str
    train_rows: list[dict]
    eval_rows: list[dict]  # validation rows: a run's held-out check and `compare --split validation`
    reward_functions: list[RewardFn]
    reward_weights: list[float]
    system_prompt: str | None
    # 1.0 when a completion is right; an accuracy is the share it rates right (tasks/accuracy.py).
    accuracy_reward: Callable | None
    warnings: list[str]
    # A multi-turn task: row -> Environment (environment.py), which scores the episode; None: single-turn.
    make_env: Callable | None = None
    curriculum: Curriculum | None = None  # adaptive task selection (curriculum.py), when on
    # Without a chat template: the plain-text frame of each prompt ("{prompt}" marks it), and where answers
    # end.
    prompt_format: str | None = None
    stop: list[str] = field(default_factory=list)
    # row -> a known-good answer to the prompt, or None (gsm8k: the worked solution); --guide puts it into
    # groups.
    reference_answer: Callable | None = None
    # row -> a scripted episode's actions, the model's turns in order, or None (web: the planned clicks); sft
    # learns them.
    reference_actions: Callable | None = None
    # Test rows (tasks/splits.py): `compare`/`eval --split test`; a run never checks itself on them.
    test_rows: list[dict] = field(default_factory=list)


def is_chat_model(model: str | None) -> bool:
    """Whether a model gets a task's chat variant: every model but the embedded tiny one.

    The embedded model was trained on the arith task's own format ("#### N"
    lines) with no instructions; any other model is taken for a pretrained
    chat model, which has to be told the answer form the task scores.
    """
    from ..models.loading import EMBEDDED_MODEL, embedded_model_path
    from ..models.run_models import base_model

    model = base_model(model)  # a run folder: the model it was trained from, whose prompts it learned
    if not isinstance(model, str) or model in ("", EMBEDDED_MODEL):
        return False  # no model named (a value of the wrong type is config validation's to refuse)
    return Path(model).expanduser().resolve() != embedded_model_path().resolve()


def is_base_model(model: str | None) -> bool:
    """A pretrained model whose files carry no chat template (read from the file, before the model loads)."""
    from ..models.model_info import has_chat_template
    from ..models.run_models import base_model

    return is_chat_model(model) and not has_chat_template(base_model(model))


def recommended_settings(task: str, model: str | None) -> dict:
    """Settings a task recommends, below the YAML file and the typed flags."""
    if task in BUILTIN_TASKS:
        return task_module(task).recommended_settings(model)
    return {}


def _custom_rewards(config: TrainConfig) -> list[RewardFn]:
    if not config.reward_file:
        raise ConfigError("this task needs --reward-file FILE --reward NAME (no built-in rewards)")
    try:
        return load_reward_functions(config.reward_file, config.reward)
    except ValueError as e:
        raise ConfigError(str(e)) from None


@lru_cache(maxsize=None)
def task_module(name: str) -> TaskModule:
    """A built-in task's module, its contract checked once (tasks/contract.py)."""
    return TaskModule.of(importlib.import_module(BUILTIN_TASKS[name]), name)


def base_task(config: TrainConfig) -> Task:
    """The task as its module (or --data and --reward-file) defines it: rows split, rewards, environment.

    Every setting is checked here, the judge's and the tools file's too; run/task_setup.py's load_task
    then adds those two (sft, which reads neither, stops here)."""
    warnings: list[str] = []
    if config.task not in TASKS:
        raise ConfigError(f"unknown task {config.task!r}; choose from {', '.join(TASKS)}")

    if config.task in BUILTIN_TASKS:
        module = task_module(config.task)
        try:
            train, validation, test = (
                module.load_rows(split, config) for split in ("train", "validation", "test")
            )
        except ConfigError:
            raise  # the task's own complete message (e.g. a missing toolchain and how to install it)
        except (OSError, ValueError) as e:
            raise ConfigError(f"task {config.task!r}: could not load its data ({e})") from None
        chat = is_chat_model(config.model) and module.has_chat_variant
        rewards = module.chat_rewards if chat else module.rewards
        functions = [fn for fn, _ in rewards]
        weights = [w for _, w in rewards]
        system_prompt = module.chat_system_prompt if chat else module.system_prompt
        accuracy = module.chat_accuracy_reward if chat else module.accuracy_reward
        make_env, factory, reads_data = module.make_env, module.episode_factory, module.reads_data
        reference, actions = module.reference_answer, module.reference_actions
    else:
        train = validation = test = None
        functions, weights, system_prompt, accuracy, make_env, factory, reads_data = (
            [],
            [],
            None,
            None,
            None,
            None,
            False,
        )
        reference = actions = None
    # An environment with no reward functions of completions totals its episodes' rewards itself (web).
    scores_itself = (make_env is not None or factory is not None) and not functions
    if scores_itself and ((config.data and not reads_data) or config.reward_file or config.reward):
        raise ConfigError(
            f"task {config.task!r} is scored by its environment: --data, --reward-file and --reward do not "
            "apply"
        )
    if scores_itself and config.shaping != "always":
        raise ConfigError(
            f"task {config.task!r} totals its episodes' rewards in its environment: --shaping "
            f"{config.shaping} needs rewards the trainer weighs (--shaping always)"
        )
    if factory is not None and config.data and not reads_data:
        raise ConfigError(f"task {config.task!r} makes its own rows: --data does not apply")

    if config.data and train is None:
        try:
            train, note = load_rows(config.data, "train", config.on_bad_data)
            warnings += [note] if note else []
            validation, note = load_rows(config.data, "validation", config.on_bad_data)
            warnings += [note] if note else []
            test, note = load_rows(config.data, "test", config.on_bad_data)
            warnings += [note] if note else []
        except DataError as e:
            raise ConfigError(str(e)) from None
    elif train is None:
        raise ConfigError("task 'custom' needs --data (a JSONL file, a folder or a dataset name)")

    train, validation, test = split_held_out(
        train, validation, test, warnings, config.data or f"task {config.task!r}"
    )
    if config.reward_file:
        functions = _custom_rewards(config)
        weights = [1.0] * len(functions)
        accuracy = functions[0]
    elif config.reward:
        by_name = {reward_name(f): (f, w) for f, w in zip(functions, weights)}
        unknown = [n for n in config.reward if n not in by_name]
        if unknown:
            raise ConfigError(
                f"task {config.task!r} has no reward {unknown[0]!r}; it has {', '.join(by_name)}"
            )
        functions = [by_name[n][0] for n in config.reward]
        weights = [1.0] * len(functions)
    elif not functions and not scores_itself:
        functions = _custom_rewards(config)
        weights = [1.0] * len(functions)
    if config.reward_weights is not None:
        if len(config.reward_weights) != len(functions):
            raise ConfigError(
                f"reward_weights has {len(config.reward_weights)} entries but task {config.task!r} has "
                f"{len(functions)} rewards ({', '.join(reward_name(f) for f in functions)})"
            )
        weights = list(config.reward_weights)
    if config.judge and (make_env is not None or factory is not None):
        raise ConfigError(f"task {config.task!r} is scored by its environment: --judge does not apply")
    system_prompt = config.system_prompt if config.system_prompt is not None else system_prompt
    if factory is not None:
        if config.tools:
            raise ConfigError(f"task {config.task!r} brings its own tools: --tools does not apply")
        make_env = factory(config, functions, weights, system_prompt)
    if config.tools and make_env is not None:
        raise ConfigError(f"task {config.task!r} plays its own environment: --tools does not apply")
    # A tools file makes every row a tool-calling episode (run/task_setup.py adds it).
    check_settings_apply(config, multi_turn=make_env is not None or bool(config.tools))
    return Task(
        name=config.task,
        train_rows=train,
        eval_rows=validation[: config.eval_num_problems],
        test_rows=test[: config.eval_num_problems],
        reward_functions=functions,
        reward_weights=weights,
        system_prompt=system_prompt,
        accuracy_reward=accuracy,
        warnings=warnings,
        make_env=make_env,
        curriculum=Curriculum.from_config(config),
        prompt_format=config.prompt_format,
        stop=list(config.stop),
        # Data of one's own may carry the answers a run is guided by in a "reference" column.
        reference_answer=reference
        or (reference_column if any("reference" in r for r in train[:100]) else None),
        reference_actions=actions,
    )


def token_budget(task: Task, config: TrainConfig) -> int:
    """The most tokens one rollout holds: max_tokens for a completion, max_episode_tokens for an episode
    (its model turns and observations after the first prompt). Length shaping and dr_grpo read it."""
    return config.max_episode_tokens if task.make_env is not None else config.sampling.max_tokens


# Settings a multi-turn task's episodes never read: refused, not ignored.
SINGLE_TURN_ONLY = {
    "eval_pass_k": "held-out episodes are played greedily once each",
    "prompt_format": "an episode's prompts go through the chat template",
    "stop": "an episode's turns end at the model's end token",
}


def check_settings_apply(config: TrainConfig, multi_turn: bool) -> None:
    """A ConfigError for a setting the task cannot apply, in one line."""
    if multi_turn:
        for name, why in SINGLE_TURN_ONLY.items():
            if getattr(config, name):
                raise ConfigError(
                    f"task {config.task!r} plays multi-turn episodes: {name} does not apply ({why})"
                )
    budget, what = (
        (config.max_episode_tokens, "max_episode_tokens")
        if multi_turn
        else (config.sampling.max_tokens, "max_tokens")
    )
    if config.overlong_buffer >= budget:
        raise ConfigError(
            f"overlong_buffer must be below {what} = {budget} (the budget it shapes lengths "
            f"against), got {config.overlong_buffer}"
        )


def reference_column(row: dict) -> str | None:
    value = row.get("reference")
    return value if isinstance(value, str) and value.strip() else None
