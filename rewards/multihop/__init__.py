"""Multi-hop question answering with tools, fully offline (world.py, corpus.py, answers.py, musique.py).

The task `mlx-grpo train --task multihop` (training.py): the model searches and
reads a row's paragraphs through tool calls and answers; exact match is the reward.
"""

from .answers import exact_match, final_answer, normalize, support_recall, token_f1
from .corpus import Corpus
from .musique import load_musique
from .training import (
    READS_DATA,
    REWARDS,
    SYSTEM_PROMPT,
    MultihopEnv,
    accuracy_reward,
    episode_factory,
    load_rows,
    recommended_settings,
    reference_actions,
)
from .world import HOPS, make_row, make_world

__all__ = [
    "Corpus",
    "HOPS",
    "MultihopEnv",
    "exact_match",
    "final_answer",
    "load_musique",
    "make_row",
    "make_world",
    "normalize",
    "support_recall",
    "token_f1",
    # The task protocol of mlx_grpo/tasks/registry.py: `mlx-grpo train --task multihop`.
    "READS_DATA",
    "REWARDS",
    "SYSTEM_PROMPT",
    "accuracy_reward",
    "episode_factory",
    "load_rows",
    "recommended_settings",
    "reference_actions",
]
