"""The multihop task for `mlx-grpo train --task multihop` (the task protocol of mlx_grpo/tasks/registry.py).

Every row is a tool-calling episode (mlx_grpo/tools/episode.py): the model
gets the question and two tools over the row's own paragraphs, `search(query)`
(BM25) and `read(title)`, calls them as its chat template writes calls (or
the Hermes-style fallback), and answers in a turn without a call.

Rows are synthetic (world.py: a seeded fictional world a row, 2 to 4 hops,
`multihop_hops` picks) or MuSiQue rows from `--data` (musique.py). Train and
test rows never share a world. Rewards: exact match (the accuracy, weight 1),
token F1 and supporting-paragraph recall (weight 0: logged, not trained on;
`--reward-weights 1,0.5,0.1` turns them on).
"""

from __future__ import annotations

import json
import sys

from mlx_grpo.config import ConfigError
from mlx_grpo.tools.episode import ToolEnv

from .answers import exact_match, exact_match_reward, f1_reward, support_reward
from .corpus import Corpus
from .musique import load_musique
from .world import CHAIN_NAMES, CHAINS, HOPS, chain_name, make_row

SYSTEM_PROMPT = (
    "Answer the question by looking facts up with the tools: every name in the encyclopedia is the "
    "title of its paragraph. When you know the answer, reply with the answer alone."
)
REWARDS = [(exact_match_reward, 1.0), (f1_reward, 0.0), (support_reward, 0.0)]
accuracy_reward = exact_match_reward
READS_DATA = True  # --data names MuSiQue rows instead of the synthetic ones

TRAIN_ROWS = 3000


def parse_hops(hops) -> list[int]:
    bad = [h for h in hops or [] if h not in HOPS]
    if bad:
        raise ConfigError(f"multihop_hops: questions have {', '.join(map(str, HOPS))} hops, not {bad[0]}")
    return list(hops) or list(HOPS)


def parse_chains(chains, hops: list[int]) -> tuple[list[int], list[str] | None]:
    """The hops and chains `multihop_chains` leaves: only lengths that have one of the chains."""
    bad = [c for c in chains or [] if c not in CHAIN_NAMES]
    if bad:
        raise ConfigError(
            f"multihop_chains: {bad[0]!r} is not a chain of relations; one of {', '.join(CHAIN_NAMES)}"
        )
    if not chains:
        return hops, None
    kept = [h for h in hops if any(chain_name(steps) in chains for _, steps, _ in CHAINS[h])]
    if not kept:
        raise ConfigError(f"multihop_chains {chains} have none of {hops} hops (multihop_hops)")
    return kept, list(chains)


# The held-out splits' worlds ("test/i", "final/i"), seeded apart from each other and from train's
# "train/SEED/i".
HELD_OUT_PREFIXES = {"validation": "test", "test": "final"}


def synthetic_rows(
    split: str, hops: list[int], n: int, seed: int, chains: list[str] | None = None
) -> list[dict]:
    """n rows, hops taken in turn; worlds seeded apart by split (and train by the run's seed)."""
    prefix = HELD_OUT_PREFIXES.get(split, f"train/{seed}")
    return [make_row(f"{prefix}/{i}", hops[i % len(hops)], chains) for i in range(n)]


def load_rows(split: str, config) -> list[dict]:
    if config.data:
        rows, note = load_musique(config.data, split, config.on_bad_data)
        if note:
            print(f"warning: {note}", file=sys.stderr)
        return rows
    n = config.eval_num_problems if split in HELD_OUT_PREFIXES else TRAIN_ROWS
    hops, chains = parse_chains(
        config.task_options.multihop_chains, parse_hops(config.task_options.multihop_hops)
    )
    return synthetic_rows(split, hops, n, config.seed, chains)


class MultihopEnv(ToolEnv):
    """A row's episode: its own paragraphs behind search and read; the recall of supporting ones is logged."""

    def __init__(self, row: dict, rewards, weights, system_prompt, timeout: float, style: str | None = None):
        self.corpus = Corpus(row["paragraphs"])
        super().__init__(row, self.corpus.tools(), None, rewards, weights, system_prompt, timeout, style)

    def reset(self) -> str:
        self.corpus.retrieved = []
        return super().reset()

    def columns(self) -> dict:
        return {**super().columns(), "retrieved": [list(self.corpus.retrieved)]}

    def reward(self) -> float:
        self._score_unanswered()
        return super().reward()

    def reward_parts(self) -> dict[str, float]:
        self._score_unanswered()
        return super().reward_parts()

    def _score_unanswered(self) -> None:
        """An episode cut before it answered (max_turns, the token budget) is scored on an empty answer:
        exact match and F1 0, while the supporting paragraphs it was shown still count, so a weight on
        support_reward pays for looking things up even when the turns ran out (it paid nothing)."""
        if self.answer is None and not self._parts:
            self._score("")

    def info(self) -> dict:
        supporting = {p["title"] for p in self.row["paragraphs"] if p.get("is_supporting")}
        recall = len(supporting & set(self.corpus.retrieved)) / len(supporting) if supporting else 0.0
        solved = self.answer is not None and bool(
            exact_match(self.answer, self.row["answer"], self.row.get("answer_aliases"))
        )
        return {**super().info(), "solved": solved, "tools/support_recall": recall}


def reference_actions(row: dict) -> list[str]:
    """A scripted episode (what `mlx-grpo sft --task multihop` learns): read each hop's supporting paragraph
    in the question's order, then answer. Calls are written in the hermes style, the one the tiny tool
    model's template and most chat templates teach; under another style the episode is reported unfinished."""
    titles = {p.get("idx"): p["title"] for p in row.get("paragraphs", [])}
    hops = [
        titles[step["paragraph_support_idx"]]
        for step in row.get("question_decomposition") or []
        if step.get("paragraph_support_idx") in titles
    ]
    reads = [
        "<tool_call>\n" + json.dumps({"name": "read", "arguments": {"title": title}}) + "\n</tool_call>"
        for title in hops
    ]
    return [*reads, row["answer"]]


def episode_factory(config, functions, weights, system_prompt):
    """make_env for the registry: each row its MultihopEnv, with the run's rewards, tool time limit and
    call style."""
    return lambda row: MultihopEnv(
        row, functions, weights, system_prompt, config.tool_timeout, config.tool_style
    )


def recommended_settings(model: str | None) -> dict:
    """Room for a few calls and their results; the tiny tool model (when built) for the embedded default."""
    settings = {"max_tokens": 96, "max_turns": 6, "max_episode_tokens": 1536, "eval_num_problems": 100}
    from . import tiny_model

    if model in (None, "") and tiny_model.tiny_tool_model() is not None:
        settings.update(tiny_model.TINY_TOOL_SETTINGS, model=str(tiny_model.tiny_tool_model()))
    return settings
