"""The web task for `mlx-grpo train --task web` (the task protocol of mlx_grpo/tasks/registry.py).

It is a multi-turn task: `episode_factory` gives each row its WebEnv, which scores
the episode; there are no reward functions of completions (REWARDS is empty)
and accuracy is the fraction of held-out episodes solved. The `web_reward` setting
chooses what an unsolved episode's success part pays: the fraction of the task's
constraints met (partial), nothing (solved), or what it met beyond an episode
that saves or submits the untouched form (progress; env.py's `progress`).

Rows are task descriptions ({"task_id", "family", "difficulty", "seed",
"kind", "instruction", "prompt"}); `web_kinds` keeps only some kinds
("fact/1", "shop/2", ...). Train, validation and test tasks come from different
seeds and never share a task (a world and what to do in it). `--data FILE`
names the test tasks instead: JSONL rows {"family", "difficulty", "seed"}
(scripts/web_tasks.py writes such a file), so held-out tasks can come from any seed.
"""

from __future__ import annotations

from pathlib import Path

from ..jsonl import jsonl_records
from .actions import ACTION_HELP
from .env import WebEnv
from .tasks import DIFFICULTIES, FAMILIES, generate_tasks, make_task, task_from_row

SYSTEM_PROMPT = (
    "You are browsing a website to complete a task. Each message shows the current page: [n] numbers "
    "its links, <buttons>, text fields and drop-downs. Reply with exactly one action and nothing else: "
    f"{ACTION_HELP}."
)
REWARDS: list = []
accuracy_reward = None

TRAIN_TASKS = 2400
READS_DATA = True  # --data names the test tasks (read_task_file)
# Seeds the train split cannot use (train seeds follow --seed).
HELD_OUT_SEEDS = {"validation": 1_000_003, "test": 1_000_004}
# Each kind's held-out stream that the train split never draws from, however many rows --n asks for
# (the first of each stream); a run's record (trained_rows.json) guards beyond it.
HELD_OUT_PER_KIND = 200
KINDS = [f"{f}/{d}" for f in FAMILIES for d in DIFFICULTIES]


def parse_kinds(kinds) -> list[tuple[str, int]]:
    """["fact/1", ...] -> [("fact", 1), ...]; all kinds when empty. ValueError names a bad one."""
    out = []
    for kind in kinds or KINDS:
        if kind not in KINDS:
            raise ValueError(f"unknown web task kind {kind!r}; choose from {', '.join(KINDS)}")
        family, level = kind.split("/")
        out.append((family, int(level)))
    return out


def tasks_of(kinds, n: int, seed: int):
    """About n tasks, spread evenly over the kinds."""
    per = max(1, n // len(kinds))
    return [
        t for family, level in kinds for t in generate_tasks(per, seed, difficulty=level, families=[family])
    ]


def read_task_file(path) -> list[dict]:
    """Task rows from a JSONL file of {"family", "difficulty", "seed"}; ValueError names a bad line."""
    if not Path(path).is_file():
        raise ValueError(f"web task file not found: {path}")
    rows = []
    for where, record in jsonl_records(path):
        missing = [
            k for k in ("family", "difficulty", "seed") if not isinstance(record, dict) or k not in record
        ]
        if missing:
            raise ValueError(
                f"{where}: a web task row needs 'family', 'difficulty' and 'seed' (no {missing[0]!r})"
            )
        if record["family"] not in FAMILIES:
            raise ValueError(
                f"{where}: unknown family {record['family']!r}; choose from {', '.join(FAMILIES)}"
            )
        if record["difficulty"] not in DIFFICULTIES or isinstance(record["difficulty"], bool):
            raise ValueError(
                f"{where}: unknown difficulty {record['difficulty']!r}; choose from "
                f"{', '.join(map(str, DIFFICULTIES))}"
            )
        if not isinstance(record["seed"], int) or isinstance(record["seed"], bool):
            raise ValueError(f"{where}: seed must be a whole number, got {record['seed']!r}")
        try:
            task = make_task(record["family"], record["difficulty"], record["seed"])
        except ValueError as e:  # a world with no possible task of this kind
            raise ValueError(
                f"{where}: no {record['family']}/{record['difficulty']} task in the "
                f"world of seed {record['seed']} ({e})"
            ) from None
        rows.append({**task.row(), "prompt": task.instruction})
    if not rows:
        raise ValueError(f"{path}: no web task rows")
    return rows


def load_rows(split: str, config) -> list[dict]:
    kinds = parse_kinds(config.task_options.web_kinds)
    if split == "test" and config.data:
        return read_task_file(Path(config.data).expanduser())
    if split in HELD_OUT_SEEDS:
        tasks = tasks_of(kinds, config.eval_num_problems, HELD_OUT_SEEDS[split])
        # Interleave kinds, so a short evaluation still covers each one.
        by_kind = [[t for t in tasks if (t.family, t.difficulty) == k] for k in kinds]
        tasks = [group[i] for i in range(max(map(len, by_kind))) for group in by_kind if i < len(group)]
        rows = [{**t.row(), "prompt": t.instruction} for t in tasks]
        if split == "test":  # apart from validation, whatever the seeds draw
            validation = _held_out_ids(kinds, ("validation",))
            rows = [r for r in rows if r["task_id"] not in validation]
        return rows
    held_out = _held_out_ids(kinds, tuple(HELD_OUT_SEEDS))
    tasks = tasks_of(kinds, TRAIN_TASKS, config.seed)
    return [{**t.row(), "prompt": t.instruction} for t in tasks if t.task_id not in held_out]


def _held_out_ids(kinds, splits: tuple[str, ...]) -> set[str]:
    """The ids of the held-out streams' first HELD_OUT_PER_KIND tasks of each kind."""
    per_split = HELD_OUT_PER_KIND * len(kinds)
    return {t.task_id for split in splits for t in tasks_of(kinds, per_split, HELD_OUT_SEEDS[split])}


def episode_factory(config, functions, weights, system_prompt):
    """make_env for the registry: each row its WebEnv, paying an unsolved episode as `web_reward` says."""
    return lambda row: WebEnv(task_from_row(row), pay=config.task_options.web_reward)


def reference_actions(row: dict) -> list[str]:
    """The task's scripted solution, one action a model turn (what `mlx-grpo sft --task web` learns)."""
    return task_from_row(row).oracle_actions()


def recommended_settings(model: str | None) -> dict:
    """Multi-turn limits for web pages; the tiny web model (when built) for the embedded default."""
    settings = {
        "max_tokens": 32,
        "max_turns": 8,
        "max_episode_tokens": 1536,
        "curriculum": "ued",
        "curriculum_key": "kind",
        "eval_num_problems": 48,
    }
    from . import tiny_model

    if model in (None, "") and tiny_model.tiny_web_model() is not None:
        settings.update(tiny_model.TINY_WEB_SETTINGS, model=str(tiny_model.tiny_web_model()))
    return settings
