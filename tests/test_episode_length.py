"""An episode's length is the model's own tokens (Episode.model_tokens), as compare counts it: a step's
completion/mean_length and tokens_per_s, its completions.jsonl records and the held-out evaluation
leave the observations out."""

import time

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.config import build_config
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.step_metrics import completion_records, step_metrics
from mlx_grpo.run.step_rollouts import collect_rollouts, rollout_settings
from mlx_grpo.run.step_update import choose_trained
from mlx_grpo.sampling import kinds
from mlx_grpo.tasks.registry import Task

LONG = "an observation much longer than any turn the model writes " * 3


class TalkativeEnv:
    """Answers a long observation to every action; done after three actions."""

    def reset(self):
        self.steps = 0
        return "start"

    def step(self, action):
        self.steps += 1
        return LONG, self.steps >= 3, {"solved": False}

    def reward(self):
        return float(self.steps)


def _task():
    rows = [{"prompt": name} for name in "ab"]
    return Task("talkative", rows, rows, [], [], None, None, [], make_env=lambda row: TalkativeEnv())


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    return load_policy(str(tiny_model_path))


def _config():
    return build_config(
        {
            "group_size": 2,
            "batch_size": 2,
            "max_tokens": 6,
            "max_turns": 3,
            "max_episode_tokens": 600,
            "micro_batch_size": 4,
            "steps": 1,
            "warmup_steps": 0,
        }
    )


def test_a_steps_lengths_count_the_models_tokens_not_the_observations(policy):
    model, tokenizer = policy
    task, config = _task(), _config()
    mx.random.seed(0)
    sampled = collect_rollouts(model, tokenizer, task, config, step=1)
    episodes = sampled.completions
    own = [int(sum(ep.mask)) for ep in episodes]  # the model's tokens, counted from the loss mask
    assert all(len(ep.tokens) > 3 * n for ep, n in zip(episodes, own))  # observations dwarf the turns
    trained = choose_trained(sampled, config)
    metrics = step_metrics(task, config, sampled, trained, 0, 1.0, time.perf_counter())
    assert metrics["completion/mean_length"] == pytest.approx(np.mean(own))
    assert metrics["tokens_per_s"] == pytest.approx(sum(own) / sampled.seconds)
    records = completion_records(tokenizer, task, 1, sampled, trained)
    assert [r["length"] for r in records] == own


def test_held_out_mean_length_counts_the_models_tokens(policy, monkeypatch):
    model, tokenizer = policy
    played = []

    def rollout_episodes(*args, **kwargs):
        played.extend(original(*args, **kwargs))
        return played

    original = kinds.rollout_episodes
    monkeypatch.setattr(kinds, "rollout_episodes", rollout_episodes)
    result = kinds.MultiTurn(_task()).evaluate(model, tokenizer, rollout_settings(_config()))
    own = [sum(ep.mask) for ep in played]
    assert len(played) == 2 and all(len(ep.tokens) > 3 * n for ep, n in zip(played, own))
    assert result["mean_length"] == pytest.approx(np.mean(own))
