"""Adaptive task selection (unsupervised environment design, "UED"), for any task.

Tasks are grouped by a row column (`curriculum_key`; the web task's `kind`,
e.g. "fact/1"). A row without that column, or every row with
`curriculum_key: prompt`, is a group of its own: so any task with a checkable
answer (arith, gsm8k, a custom task with an accuracy reward) is drawn by each
prompt's measured pass rate. For each group the curriculum keeps an estimate p
of how often the model solves it: an exponential moving average of the
observed success rate of its groups. Before a group is seen, p is 0.5 for a
named group (the most favoured value: a few families are each tried soon)
and, for a single prompt, the mean success observed so far over all prompts:
among thousands of prompts an optimistic 0.5 would draw almost only unseen
ones, and where right answers are rare (GSM8K on a small model: 2%) a prompt
is most likely as hard as the others.

A group is drawn with probability

    (1 - explore) * w / sum(w) + explore / K,     w = p * (1 - p)

so groups solved about half the time, whose GRPO groups have the most reward
variance and so the most signal, are favoured; those always or never solved
are still drawn through the `explore` share. A row is then drawn uniformly
within its group. Draws are seeded by (seed, step), and the estimates are the
only state: `state_dict()` is saved in checkpoints and `load_state_dict()`
restores it, so a resumed run draws the same tasks.
"""

from __future__ import annotations

import numpy as np

from .accuracy import accuracy_of, accuracy_values, solved

RATE = 0.3  # weight of the newest observation in the moving average
PRIOR = 0.5  # the estimate of a named group never seen (the most favoured value)
PROMPT_GROUP = "prompt:"  # the name of a group of one prompt starts with this
LOGGED_GROUPS = 24  # per-group metrics are written only when there are at most this many


class Curriculum:
    def __init__(self, key: str = "kind", explore: float = 0.2, rate: float = RATE, prior: float = PRIOR):
        self.key, self.explore, self.rate, self.prior = key, explore, rate, prior
        self.estimates: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.observed = [
            0.0,
            0,
        ]  # sum and number of every success rate folded in: the prior of an unseen prompt
        self._groups_of: tuple[int, dict[str, list[int]]] | None = None

    @classmethod
    def from_config(cls, config) -> Curriculum | None:
        if config.curriculum == "none":
            return None
        return cls(config.curriculum_key, config.curriculum_explore)

    def group_of(self, row: dict) -> str:
        value = None if self.key == "prompt" else row.get(self.key)
        return str(value) if value is not None else f"{PROMPT_GROUP}{row.get('prompt')}"

    def estimate(self, name: str) -> float:
        if name in self.estimates:
            return self.estimates[name]
        if name.startswith(PROMPT_GROUP) and self.observed[1]:
            return self.observed[0] / self.observed[1]
        return self.prior

    def _groups(self, rows: list[dict]) -> dict[str, list[int]]:
        if self._groups_of is None or self._groups_of[0] != id(rows):
            groups: dict[str, list[int]] = {}
            for i, row in enumerate(rows):
                groups.setdefault(self.group_of(row), []).append(i)
            self._groups_of = (id(rows), groups)
        return self._groups_of[1]

    def probabilities(self, names: list[str]) -> np.ndarray:
        """The chance of drawing each group of `names`."""
        p = np.array([self.estimate(n) for n in names])
        w = p * (1 - p)
        uniform = np.full(len(names), 1 / len(names))
        if w.sum() <= 0:
            return uniform
        return (1 - self.explore) * w / w.sum() + self.explore * uniform

    def pick(self, rows: list[dict], step: int, batch_size: int, seed: int) -> list[dict]:
        """The rows of one step: a group by `probabilities`, then a row of it, `batch_size` times."""
        groups = self._groups(rows)
        names = sorted(groups)
        rng = np.random.default_rng([seed, step, 0x5EED])
        chosen = rng.choice(len(names), size=batch_size, p=self.probabilities(names))
        return [rows[groups[names[c]][int(rng.integers(len(groups[names[c]])))]] for c in chosen]

    def update(self, rows: list[dict], success: list[float]) -> None:
        """Fold in one observed success rate (0..1) per row: the mean over its group of completions."""
        for row, s in zip(rows, success):
            name = self.group_of(row)
            self.estimates[name] = (1 - self.rate) * self.estimate(name) + self.rate * float(s)
            self.counts[name] = self.counts.get(name, 0) + 1
            self.observed = [self.observed[0] + float(s), self.observed[1] + 1]

    def metrics(self, rows: list[dict]) -> dict:
        """What the curriculum believes and the distribution it draws from, for metrics.jsonl."""
        names = sorted(self._groups(rows))
        probs = self.probabilities(names)
        out = {
            "curriculum/groups": len(names),
            "curriculum/groups_seen": sum(1 for n in names if n in self.counts),
            "curriculum/mean_estimate": float(np.mean([self.estimate(n) for n in names])),
            # Entropy of the draw relative to uniform: 1 = uniform, lower = concentrated.
            "curriculum/entropy": float(
                -(probs * np.log(probs + 1e-12)).sum() / max(np.log(len(names)), 1e-12)
            ),
        }
        if len(names) <= LOGGED_GROUPS:
            for name, prob in zip(names, probs):
                out[f"curriculum/prob/{name}"] = float(prob)
                out[f"curriculum/estimate/{name}"] = float(self.estimate(name))
        return out

    def state_dict(self) -> dict:
        return {
            "key": self.key,
            "explore": self.explore,
            "rate": self.rate,
            "prior": self.prior,
            "estimates": dict(self.estimates),
            "counts": dict(self.counts),
            "observed": list(self.observed),
        }

    def load_state_dict(self, state: dict) -> None:
        self.estimates = {str(k): float(v) for k, v in state.get("estimates", {}).items()}
        self.counts = {str(k): int(v) for k, v in state.get("counts", {}).items()}
        total, n = state.get("observed", (0.0, 0))  # absent in checkpoints written before it was kept
        self.observed = [float(total), int(n)]


def group_success(task, rows: list[dict], completions: list, scores, group_size: int) -> list[float]:
    """Each row's observed success rate: the fraction of its completions (or episodes) that solved it.

    Episodes count when solved, single-turn completions by their accuracy, as accuracy.py
    judges them. A reference answer put into
    the group (--guide) is not the model's: only sampled members count.
    """
    if completions and hasattr(completions[0], "info"):
        success = [float(solved(c)) for c in completions]
    elif task.accuracy_reward is not None:
        success = list(accuracy_of(accuracy_values(task, rows, group_size, completions, scores)))
    else:  # no notion of "solved": a positive reward counts
        success = [float(t > 0) for t in scores.total]
    sampled = np.array([not getattr(c, "guided", False) for c in completions] or [True] * len(success))
    success = np.array(success).reshape(len(rows), group_size)
    return [float(row[keep].mean()) for row, keep in zip(success, sampled.reshape(len(rows), group_size))]
