"""What one step trains on: its prompts, sampled and scored in groups.

`collect_rollouts` takes the step's prompts (a fixed, seeded order, or the
curriculum's pick), samples `group_size` completions for each and scores them,
then shapes and filters them (shaping.py's step_rewards, which the API's
Trainer.update calls too). With DAPO dynamic sampling it samples further
rounds (bounded) until enough groups carry signal. With several ranks
(distributed.py) each samples a share of whole prompts and every rank gets the
whole step back.

Every random draw is keyed by (seed, step, round, prompt, member), so a step
samples the same completions whether the run was resumed before it, and
whichever rank takes a prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..config import TrainConfig
from ..sampling.kinds import RolloutSettings, rollouts_for
from ..tasks.curriculum import group_success
from ..tasks.registry import Task
from ..tasks.rewarding import Scores
from ..tasks.shaping import step_rewards
from ..update.batch import batch_rows
from . import distributed as dist
from .guidance import guide_groups


def rollout_settings(config: TrainConfig) -> RolloutSettings:
    """What sampling/ takes from the run's settings to sample a step's groups and to evaluate."""
    return RolloutSettings(
        config.group_size,
        config.sampling,
        config.decode_concurrency,
        config.max_turns,
        config.max_episode_tokens,
        config.eval_pass_k,
        config.seed,
    )


def rollout_and_score(
    model, tokenizer, task: Task, rows: list[dict], config: TrainConfig, seed: int | None = None
):
    """Sample and score the groups of `rows`: (completions, scores, seconds).

    Completions are keyed by (seed, prompt position in the step, member), so a
    prompt samples the same group whichever rank takes it. With several ranks
    (distributed.py) each samples and scores a contiguous share of whole
    prompts, and every rank gets the whole back.
    """
    if dist.size() == 1:
        return _sample_and_score(model, tokenizer, task, rows, config, seed, 0)
    share = dist.shard(len(rows))
    try:
        local = (
            _sample_and_score(
                model, tokenizer, task, rows[share.start : share.stop], config, seed, share.start
            )
            if len(share)
            else None
        )
    except Exception as e:  # passed to every rank, so none waits forever for this one
        local = e
    shares = dist.all_gather_objects(local)
    for x in shares:
        if isinstance(x, Exception):
            raise x
    return merge_rollouts(shares, config.group_size)


def merge_rollouts(shares: list, group_size: int):
    """(completions, scores, seconds) of consecutive shares of a step's prompts -> those of the whole."""
    shares = [x for x in shares if x is not None]
    completions, offset = [], 0
    for share, _, _ in shares:
        completions += [replace(c, prompt_index=c.prompt_index + offset) for c in share]
        offset += len(share) // group_size
    names = list(dict.fromkeys(name for _, scores, _ in shares for name in scores.parts))
    errors, examples = {}, {}
    for _, scores, _ in shares:
        for name, n in scores.errors.items():
            errors[name] = errors.get(name, 0) + n
        for name, example in scores.error_examples.items():
            examples.setdefault(name, example)
    scores = Scores(
        total=np.concatenate([sc.total for _, sc, _ in shares]),
        parts={
            name: [v for c, sc, _ in shares for v in sc.parts.get(name, [None] * len(c))] for name in names
        },
        errors=errors,
        error_examples=examples,
    )
    return completions, scores, max(seconds for _, _, seconds in shares)


def _sample_and_score(model, tokenizer, task: Task, rows: list[dict], config: TrainConfig, seed, first: int):
    """rollout_and_score on this process alone; rows[0] is the step's prompt number `first`."""
    settings = rollout_settings(config)
    completions, scores, rollout_s = rollouts_for(task).sample_and_score(
        model, tokenizer, rows, settings, seed, first
    )
    if (
        config.guide
    ):  # a reference answer (or scripted episode) into each group with no right one (guidance.py)
        completions, scores = guide_groups(model, tokenizer, task, rows, completions, scores, settings)
    return completions, scores, rollout_s


def step_seed(seed: int, step: int) -> int:
    """The random seed of one step.

    Re-seeding MLX's generator at every step from (seed, step) makes step k
    sample the same completions whether or not the run was resumed before it:
    the random state a checkpoint needs is just (seed, step).
    """
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


def rollout_seed(seed: int, step: int, round_: int) -> int:
    """The sampling seed of one step's round of rollouts (each completion's keys derive from it)."""
    return int(np.random.SeedSequence([seed, step, round_, 1]).generate_state(1)[0])


@dataclass
class StepRollouts:
    """Everything sampled in one step (every round), and which groups are trained on."""

    rows: list[dict]
    completions: list  # group by group; prompt_index points into rows
    raw_rewards: np.ndarray  # the weighted reward sum, before length penalties
    rewards: np.ndarray  # after length penalties: what advantages are computed from
    parts: dict[str, list]
    errors: dict[str, int]
    error_examples: dict[str, str]
    keep: np.ndarray  # one bool per group: trained on
    rounds: int
    seconds: float


def resample_rows(rows: list[dict], step: int, round_: int, count: int, seed: int) -> list[dict]:
    """Extra prompts for dynamic sampling: seeded by (seed, step, round), so resume sees the same."""
    picks = np.random.default_rng([seed, step, round_]).choice(len(rows), count, replace=len(rows) < count)
    return [rows[int(i)] for i in picks]


def collect_rollouts(model, tokenizer, task: Task, config: TrainConfig, step: int) -> StepRollouts:
    """Sample and score the step's groups; with filters on, drop groups (and maybe refill, bounded)."""
    g = config.group_size
    extra_rounds = config.resample_rounds if config.dynamic_sampling else 0
    rounds, all_rows, rewards, keep = [], [], [], []
    for round_ in range(1 + extra_rounds):
        if rounds and np.concatenate(keep).sum() >= config.batch_size:
            break
        first = task.curriculum.pick if task.curriculum else batch_rows
        rows = (
            first(task.train_rows, step, config.batch_size, config.seed)
            if round_ == 0
            else resample_rows(task.train_rows, step, round_, config.batch_size, config.seed)
        )
        completions, scores, seconds = rollout_and_score(
            model, tokenizer, task, rows, config, rollout_seed(config.seed, step, round_)
        )
        if task.curriculum:
            task.curriculum.update(rows, group_success(task, rows, completions, scores, g))
        shaped, kept = step_rewards(
            task, config, completions, scores
        )  # penalties, side rewards, filters (shaping.py)
        rounds.append((completions, scores, seconds))
        all_rows += rows
        rewards.append(shaped)
        keep.append(kept)
    completions, scores, _ = merge_rollouts(rounds, g)
    keep = np.concatenate(keep)
    # At most batch_size groups are trained on: the first ones kept, in sampling order.
    keep &= np.cumsum(keep) <= config.batch_size
    return StepRollouts(
        all_rows,
        completions,
        np.asarray(scores.total, dtype=np.float64),
        np.concatenate(rewards),
        scores.parts,
        scores.errors,
        scores.error_examples,
        keep,
        len(rounds),
        sum(seconds for _, _, seconds in rounds),
    )
