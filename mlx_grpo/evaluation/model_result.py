"""What `eval` and `compare` keep of a model's answers: each Answer, and a model's answers with their scores
(ModelResult) and its summary in report.json (accuracy, rewards, pass@k, lengths, speed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..models.loading import EMBEDDED_MODEL
from ..stats import mean_pass_at_k
from ..tasks.accuracy import right
from ..tasks.rewarding import part_means
from ..update.batch import Rollout
from .model_names import ModelSpec


@dataclass
class Answer:
    """One completion, or for a multi-turn task one episode, of a model."""

    text: str  # the completion; an episode's transcript (turns and observations)
    tokens: list[int]  # sampled ids; an episode's model and environment tokens after its first prompt
    length: int  # tokens the model wrote
    finish_reason: str  # "stop" / "length"; an episode's "done", "max_turns", "max_tokens", "env_error"
    # cut at its token budget (the rollout's `truncated`: max_tokens, an episode's max_episode_tokens)
    truncated: bool

    @classmethod
    def of(cls, rollout: Rollout) -> "Answer":
        """A completion's or an episode's answer: both are update/batch.py's Rollout."""
        return cls(
            rollout.text, rollout.tokens, rollout.model_tokens, rollout.finish_reason, rollout.truncated
        )

    of_completion = of_episode = of  # the names it had when they differed


@dataclass
class ModelResult:
    """One model's answers and scores. Arrays are per answer, grouped by prompt."""

    name: str
    spec: ModelSpec
    answers: list[Answer]
    rewards: np.ndarray  # (N*K,) weighted totals
    parts: dict[str, list]  # reward name -> N*K values (None: not applicable)
    accuracy: np.ndarray | None  # (N*K,) 1.0 where the answer is right (tasks/accuracy.py), else 0.0
    errors: dict[str, int]
    error_examples: dict[str, str]
    seconds: float  # decoding only
    samples: int
    episode: dict = field(
        default_factory=dict
    )  # a multi-turn task's episode and tool metrics (multiturn.episode_metrics)
    cached: Path | None = None  # where the answers were read from, when they were not decoded now
    cached_by: str | None = None  # which code made those answers: "mlx-grpo 0.1.0 (decode format 1)"
    stages: list[str] | None = (
        None  # the grading stage each answer reached (answer_stages.py), where the task has one
    )
    stage_shares: dict[str, float] = field(default_factory=dict)

    def per_prompt(self, values: np.ndarray) -> np.ndarray:
        return values.reshape(-1, self.samples).mean(axis=1)

    def summary(self) -> dict:
        lengths = np.array([a.length for a in self.answers])
        out = {
            "name": self.name,
            "model": self.spec.model or EMBEDDED_MODEL,
            "adapter": self.spec.adapter,
            "accuracy": float(self.accuracy.mean()) if self.accuracy is not None else None,
            "reward": float(self.rewards.mean()),
            "reward_std": float(self.rewards.std()),
            "reward_parts": part_means(self.parts),
            "reward_errors": self.errors,
            "mean_length": float(lengths.mean()),
            "truncated_frac": float(np.mean([a.truncated for a in self.answers])),
            "generated_tokens": int(lengths.sum()),
            "seconds": self.seconds,
            "tokens_per_s": float(lengths.sum() / max(self.seconds, 1e-9)),
        }
        if self.episode:
            out["episode"] = dict(self.episode)
        if self.stage_shares:
            out["stages"] = dict(self.stage_shares)
        if self.cached:
            out["answers_from_cache"] = str(self.cached)
            out["answers_made_by"] = self.cached_by
        if self.samples > 1 and self.accuracy is not None:
            successes = right(self.accuracy).reshape(-1, self.samples).sum(axis=1)
            out["pass_at_k"] = {
                str(k): mean_pass_at_k(successes, self.samples, k) for k in pass_ks(self.samples)
            }
            out["best_of_n_reward"] = float(self.rewards.reshape(-1, self.samples).max(axis=1).mean())
        return out


def pass_ks(samples: int) -> list[int]:
    """1, 2, 4, ... up to K, and K itself."""
    ks = [1]
    while ks[-1] * 2 < samples:
        ks.append(ks[-1] * 2)
    return ks + [samples] if samples > 1 else ks
