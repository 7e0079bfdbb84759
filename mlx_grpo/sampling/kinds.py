"""Single-turn or multi-turn: the one place that tells them apart.

A task either answers each prompt in one completion (arith, GSM8K, OCaml) or plays
an episode against an environment (the web task, tool calling): its `make_env`
says which. `rollouts_for(task)` reads it, here and nowhere else above this floor,
and gives one object that does everything the two do differently:

- `sample_and_score`: a training step's groups, scored (by the task's reward
  functions, or by the environments that played the episodes);
- `evaluate`: the before/after held-out accuracy (greedy; pass@k for single-turn);
- `generate` and `score`: `eval` and `compare`'s answers and their scores;
- `step_metrics`, `record` and `prompt_as_seen`: what a step logs, what
  completions.jsonl keeps of a rollout, and prompt.txt.

Both return rollouts that satisfy update/batch.py's `Rollout` (a `Completion`
or an `Episode`), so everything after sampling handles them alike. Whether an
answer is right is tasks/accuracy.py's to say.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..tasks.accuracy import accuracy_values, right, solved
from ..tasks.data import columns_of, encode_prompt, task_prompts
from ..tasks.rewarding import Scores, score_completions
from .environment import Rendered
from .episode_record import episode_record
from .heldout import evaluate_accuracy, evaluate_pass_at_k
from .multiturn import _encode, episode_metrics, episode_scores, make_envs, rollout_episodes
from .rollout import SamplingConfig, sample_completions


@dataclass(frozen=True)
class RolloutSettings:
    """What sampling a step's groups and evaluating take from a run's settings, and nothing else
    (run/step_rollouts.py's rollout_settings(config) fills it): this floor never sees the whole config.
    It has no defaults of its own: a run's are TrainConfig's, which rollout_settings(TrainConfig()) carries
    (dataclasses.replace changes one)."""

    group_size: int  # completions (episodes) a prompt
    sampling: SamplingConfig  # the run's sampling group
    concurrency: int  # sequences decoded at once (decode_concurrency)
    max_turns: int  # multi-turn tasks: model turns in an episode
    max_episode_tokens: int  # multi-turn tasks: an episode's token budget after its first prompt
    eval_pass_k: int  # evaluate: also sampled pass@k (0: off)
    seed: int  # evaluate: pass@k's own sampling seed


class SingleTurn:
    """One completion a prompt, scored by the task's reward functions."""

    plays_episodes = False

    def __init__(self, task):
        self.task = task

    def sample_and_score(
        self,
        model,
        tokenizer,
        rows: list[dict],
        settings: RolloutSettings,
        seed: int | None = None,
        first: int = 0,
    ) -> tuple[list, Scores, float]:
        """(completions, scores, seconds) of group_size completions for each row; rows[0] is the step's
        prompt number `first`, and completions are keyed by (seed, prompt, member)."""
        prompts = task_prompts(tokenizer, self.task, rows)
        model.eval()
        start = time.perf_counter()
        completions = sample_completions(
            model,
            tokenizer,
            prompts,
            settings.group_size,
            settings.sampling,
            settings.concurrency,
            seed=seed,
            prompt_ids=list(range(first, first + len(rows))),
        )
        rollout_s = time.perf_counter() - start
        g = settings.group_size
        scores = score_completions(
            self.task.reward_functions,
            self.task.reward_weights,
            [r["prompt"] for r in rows for _ in range(g)],
            [c.text for c in completions],
            columns_of(rows, g, completions),
        )
        return completions, scores, rollout_s

    def evaluate(self, model, tokenizer, settings: RolloutSettings) -> dict:
        """Held-out accuracy of greedy completions, and sampled pass@k when eval_pass_k asks for it."""
        s = settings
        result = evaluate_accuracy(model, tokenizer, self.task, s.sampling.max_tokens, s.concurrency)
        if s.eval_pass_k > 0:
            result["pass_at_k"] = evaluate_pass_at_k(
                model,
                tokenizer,
                self.task,
                s.eval_pass_k,
                s.sampling.max_tokens,
                s.sampling.temperature,
                s.concurrency,
                s.seed,
            )
        return result

    def generate(
        self,
        model,
        tokenizer,
        rows: list[dict],
        k: int,
        sampling: SamplingConfig,
        concurrency: int,
        max_turns: int,
        max_episode_tokens: int,
        seed: int | None = None,
        first: int = 0,
    ) -> list:
        """k completions of each row, in one batched decode (eval and compare); rows[0] is prompt number
        `first`, and completion j of prompt p is drawn with keys of (seed, p, j) alone."""
        return sample_completions(
            model,
            tokenizer,
            task_prompts(tokenizer, self.task, rows),
            k,
            sampling,
            concurrency,
            seed=seed,
            prompt_ids=list(range(first, first + len(rows))),
        )

    def score(self, rows: list[dict], answers: list, k: int) -> tuple[Scores, np.ndarray | None]:
        """The task's rewards of k answers a row, and whether each is right (1.0) or not by tasks/accuracy.py
        (None: the task has no accuracy reward)."""
        prompts = [r["prompt"] for r in rows for _ in range(k)]
        scores = score_completions(
            self.task.reward_functions,
            self.task.reward_weights,
            prompts,
            [a.text for a in answers],
            columns_of(rows, k, answers),
        )
        if self.task.accuracy_reward is None:
            return scores, None
        return scores, right(accuracy_values(self.task, rows, k, answers, scores)).astype(float)

    def step_metrics(self, rollouts: list) -> dict:
        return {}

    def record(self, tokenizer, rollout) -> dict:
        return {}

    def prompt_as_seen(self, tokenizer, row: dict) -> str:
        """A row's prompt exactly as the model reads it: template, system prompt and frame included."""
        task = self.task
        return tokenizer.decode(
            encode_prompt(tokenizer, row["prompt"], task.system_prompt, task.prompt_format)
        )


class MultiTurn:
    """One episode a prompt against the row's environment, which scores it."""

    plays_episodes = True

    def __init__(self, task):
        self.task = task

    def sample_and_score(
        self,
        model,
        tokenizer,
        rows: list[dict],
        settings: RolloutSettings,
        seed: int | None = None,
        first: int = 0,
    ) -> tuple[list, Scores, float]:
        """(episodes, scores, seconds): group_size episodes a row, env tokens masked; rows[0] is the step's
        prompt number `first` (episodes are keyed by their place in the step)."""
        s = settings
        model.eval()
        start = time.perf_counter()
        # The seed goes to the rollout (alike on every rank), never into MLX's global random state.
        episodes = rollout_episodes(
            model,
            tokenizer,
            make_envs(self.task, rows, s.group_size),
            s.group_size,
            s.sampling,
            s.max_turns,
            s.max_episode_tokens,
            self.task.system_prompt,
            s.concurrency,
            seed=seed,
            first_prompt=first,
        )
        return episodes, episode_scores(episodes), time.perf_counter() - start

    def evaluate(self, model, tokenizer, settings: RolloutSettings) -> dict:
        """The fraction of held-out episodes solved, played greedily."""
        rows = self.task.eval_rows
        if not rows:
            return {"accuracy": None, "n": 0}
        was_training = model.training
        model.eval()
        start = time.perf_counter()
        episodes = rollout_episodes(
            model,
            tokenizer,
            make_envs(self.task, rows, 1),
            1,
            SamplingConfig(temperature=0.0, max_tokens=settings.sampling.max_tokens),
            settings.max_turns,
            settings.max_episode_tokens,
            self.task.system_prompt,
            settings.concurrency,
        )
        model.train(was_training)
        return {
            "accuracy": float(np.mean([solved(ep) for ep in episodes])),
            "n": len(rows),
            "mean_length": float(
                np.mean([ep.model_tokens for ep in episodes])
            ),  # the model's own, as compare's
            "truncated_frac": float(np.mean([ep.truncated for ep in episodes])),
            "seconds": time.perf_counter() - start,
            "completions": [ep.text for ep in episodes],
        }

    def generate(
        self,
        model,
        tokenizer,
        rows: list[dict],
        k: int,
        sampling: SamplingConfig,
        concurrency: int,
        max_turns: int,
        max_episode_tokens: int,
        seed: int | None = None,
        first: int = 0,
    ) -> list:
        """k episodes of each row, one batched decode a turn (eval and compare); rows[0] is prompt number
        `first`, and episodes are keyed by (seed, their place from there) alone."""
        return rollout_episodes(
            model,
            tokenizer,
            make_envs(self.task, rows, k),
            k,
            sampling,
            max_turns,
            max_episode_tokens,
            self.task.system_prompt,
            concurrency,
            seed=seed,
            first_prompt=first,
        )

    def score(self, rows: list[dict], episodes: list, k: int) -> tuple[Scores, np.ndarray]:
        """The environments' scores of the episodes, and whether each was solved (1.0) or not."""
        return episode_scores(episodes), np.array([float(solved(ep)) for ep in episodes])

    def step_metrics(self, episodes: list) -> dict:
        return episode_metrics(episodes)

    def record(self, tokenizer, episode) -> dict:
        """An episode's turns as trained and masked text, and its tool calls (inspect shows them)."""
        return episode_record(tokenizer, episode)

    def prompt_as_seen(self, tokenizer, row: dict) -> str:
        """A row's first observation exactly as the model reads it: template, system prompt and tools
        included."""
        env = self.task.make_env(row)
        if hasattr(env, "bind"):
            env.bind(tokenizer)
        first = env.reset()
        ids = (
            _encode(tokenizer, first)
            if isinstance(first, Rendered)
            else encode_prompt(tokenizer, first, self.task.system_prompt)
        )
        return tokenizer.decode(ids)


def rollouts_for(task) -> SingleTurn | MultiTurn:
    """The task's kind of rollout: episodes when it makes environments, else single completions."""
    return MultiTurn(task) if task.make_env is not None else SingleTurn(task)


def environment_source(task) -> str | None:
    """The file a multi-turn task's environments are made in (what an episode cache hashes); None when it has
    no source of its own (a builtin or a callable object: its task's files still count)."""
    import inspect

    try:
        return inspect.getsourcefile(inspect.unwrap(task.make_env)) if task.make_env else None
    except TypeError:
        return None
