"""One meaning of "cut": a completion cut at max_tokens and an episode cut at max_episode_tokens are
both `truncated`, and every setting and metric that reads it treats them alike."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.config import ConfigError, build_config
from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.health import Thresholds
from mlx_grpo.run.step_rollouts import collect_rollouts
from mlx_grpo.run.trainer import make_optimizer, train_step
from mlx_grpo.sampling.multiturn import Episode
from mlx_grpo.sampling.rollout import Completion
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import Task, recommended_settings, token_budget
from mlx_grpo.update.batch import Rollout


class EndlessEnv:
    """Answers "." to every action and is never done; reward 1 + the actions seen (never 0)."""

    def __init__(self, name):
        self.name = name

    def reset(self):
        self.seen = 0
        return f"start {self.name}"

    def step(self, action):
        self.seen += 1
        return ".", False, {}

    def reward(self):
        return 1.0 + self.seen


def _task():
    rows = [{"prompt": name} for name in "abcd"]
    return Task("endless", rows, [], [], [], None, None, [], make_env=lambda row: EndlessEnv(row["prompt"]))


def _config(**extra):
    settings = {
        "group_size": 2,
        "batch_size": 2,
        "max_tokens": 12,
        "max_turns": 10,
        "max_episode_tokens": 60,
        "runaway_penalty": 0.3,
        "micro_batch_size": 4,
        "steps": 3,
        "warmup_steps": 0,
        "kl_every": 0,
        **extra,
    }
    return build_config(settings)


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    return load_policy(str(tiny_model_path))


def test_a_completion_and_an_episode_say_cut_the_same_way():
    def completion(reason):
        return Completion(0, [1], [5, 6, 7], [-1.0] * 3, reason, "x")

    def episode(reason):
        return Episode(0, [1], [5, 6, 7, 8, 9], [-1.0, -1.0, 0.0, 0.0, -1.0], [1, 1, 0, 0, 1], reason)

    assert completion("length").truncated and not completion("stop").truncated
    assert episode("max_tokens").truncated
    assert not any(episode(r).truncated for r in ("done", "max_turns", "env_error"))
    assert (
        completion("stop").model_tokens == 3 and episode("done").model_tokens == 3
    )  # observations are not the model's
    assert isinstance(completion("stop"), Rollout) and isinstance(episode("done"), Rollout)


def test_episodes_cut_at_their_budget_get_the_runaway_penalty_and_length_shaping(policy):
    """Every episode runs out of its 60 tokens (the environment is never done). Each reward is the
    environment's, x0.3 for a cut one, plus DAPO's overlong term of the model's own tokens against the
    episode's budget: 0 up to 60 - 40, then down to -1 at 60. Worked out here from the episodes."""
    model, tokenizer = policy
    config = _config(overlong_buffer=40, overlong_penalty=1.0)
    mx.random.seed(0)
    sampled = collect_rollouts(model, tokenizer, _task(), config, step=1)
    episodes = sampled.completions
    assert len(episodes) == 4 and all(ep.finish_reason == "max_tokens" for ep in episodes)
    expected = []
    for ep, raw in zip(episodes, sampled.raw_rewards):
        assert raw >= 1.0
        model_tokens = sum(ep.mask)
        overlong = (20 - min(model_tokens, 60)) / 40 if model_tokens > 20 else 0.0
        expected.append(raw * 0.3 + overlong)
    np.testing.assert_allclose(sampled.rewards, expected)
    assert any(sum(ep.mask) > 20 for ep in episodes)  # the overlong term is at work
    # the observations count toward the budget, not toward the model's length
    assert any(sum(ep.mask) < len(ep.tokens) for ep in episodes)


def test_a_multi_turn_step_counts_and_masks_cut_episodes(policy, tiny_model_path):
    model, tokenizer = load_policy(str(tiny_model_path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4})
    task = _task()
    for masked in (False, True):  # (an entropy term keeps every group in the update, whatever its rewards)
        config = _config(mask_truncated=masked, entropy_coef=0.01)
        metrics, records = train_step(model, tokenizer, make_optimizer(config), task, config, 1, None)
        assert all(r["finish_reason"] == "max_tokens" for r in records)
        assert metrics["completion/truncated_frac"] == 1.0  # what the `truncated` health rule reads
        # masked: not one token of a cut episode is trained on (token statistics are None); else all are
        assert (metrics["entropy"] is None) == masked
    # the truncation rule and dr_grpo measure an episode against its own budget
    assert (
        token_budget(task, config) == 60
        and Thresholds.from_config(config, token_budget(task, config)).token_budget == 60
    )


def _web(**extra):
    settings = {
        "task": "web",
        "model": None,
        "max_tokens": 6,
        "max_turns": 2,
        "max_episode_tokens": 200,
        "web_kinds": ["fact/1"],
        "eval_num_problems": 2,
        **extra,
    }
    return build_config(settings, task_defaults=recommended_settings)


def test_settings_a_multi_turn_task_cannot_apply_are_refused_in_one_line():
    for name, value in (("eval_pass_k", 4), ("prompt_format", "Q: {prompt}\nA:"), ("stop", ["\n"])):
        with pytest.raises(ConfigError, match=f"plays multi-turn episodes: {name} does not apply") as e:
            load_task(_web(**{name: value}))
        assert "\n" not in str(e.value)
    # the length shaping buffer is measured against the episode's budget, not a turn's max_tokens
    assert load_task(_web(overlong_buffer=100)).make_env is not None
    with pytest.raises(ConfigError, match="below max_episode_tokens = 200"):
        load_task(_web(overlong_buffer=200))
    with pytest.raises(ConfigError, match="below max_tokens = 8"):
        load_task(build_config({"task": "arith", "max_tokens": 8, "overlong_buffer": 8}))


def test_eval_and_compare_call_an_episode_cut_only_at_its_budget():
    from mlx_grpo.evaluation.compare import Answer

    for reason, cut in (("max_tokens", True), ("max_turns", False), ("done", False), ("env_error", False)):
        answer = Answer.of_episode(
            Episode(0, [1], [5, 6, 7], [-1.0, 0.0, -1.0], [1, 0, 1], reason, ["a", "b"])
        )
        assert answer.truncated == cut and answer.length == 2
    assert Answer.of_completion(Completion(0, [1], [5, 6], [-1.0] * 2, "length", "x")).truncated


class TwoStepEnv:
    """Answers `observation` after the first action and is done after the second; counts its steps."""

    def __init__(self, observation):
        self.observation = observation

    def reset(self):
        self.steps = 0
        return "start"

    def step(self, action):
        self.steps += 1
        return self.observation, self.steps >= 2, {}

    def reward(self):
        return float(self.steps)


class ScriptedPlayer:
    """Plays turns as a decoder would, without a model: row e writes `lengths[turn][e]` tokens and its
    end token, or, if that is None, runs on until the wave's max_tokens stops it ("length")."""

    reuses_cache = False

    def __init__(self, tokenizer, lengths):
        from mlx_grpo.sampling.rollout import end_token_ids

        self.tokenizer, self.lengths = tokenizer, lengths
        self.word, self.end = tokenizer.encode("a", add_special_tokens=False)[0], end_token_ids(tokenizer)[0]
        self.caps = []

    def play(self, turn, episodes, chunks, contexts, sampling):
        from mlx_grpo.sampling.turns import completion

        self.caps.append(sampling.max_tokens)
        outs = []
        for row, (e, context) in enumerate(zip(episodes, contexts)):
            wants = self.lengths[turn][e]
            if wants is None or wants + 1 > sampling.max_tokens:
                tokens, finish = [self.word] * sampling.max_tokens, "length"
            else:
                tokens, finish = [self.word] * wants + [self.end], "stop"
            outs.append(completion(self.tokenizer, row, context, tokens, [-1.0] * len(tokens), finish))
        return outs, {"prefilled": 0, "prefill_s": 0.0, "decode_s": 0.0}


def test_a_turn_that_spends_exactly_its_own_remaining_budget_is_cut(policy, monkeypatch):
    """Three episodes, each 3 tokens on turn 1. Episode 0's observation is long, so on turn 2 its budget
    left (b0) is below the others' (b1); max_tokens = b0 caps the wave. Episode 0 runs on and writes exactly
    b0 tokens: its budget is spent with no end token, so it is cut there and its environment never sees
    the turn. Episode 1 runs on too, but b0 < b1 leaves it room: a turn cut at max_tokens, not an episode
    cut at its budget, so it goes to its environment (done). Episode 2 ends its turn in time (done)."""
    from mlx_grpo.sampling import multiturn
    from mlx_grpo.sampling.rollout import SamplingConfig

    model, tokenizer = policy
    budget = 120
    envs = [TwoStepEnv("a long observation " * 4), TwoStepEnv("ok"), TwoStepEnv("ok")]
    join = multiturn.chat_join(tokenizer)
    left = [
        budget - 3 - len(tokenizer.encode(join.text(env.observation, True), add_special_tokens=False))
        for env in envs
    ]
    assert left[0] < left[1] == left[2]
    player = ScriptedPlayer(tokenizer, [[2, 2, 2], [None, None, 4]])
    monkeypatch.setattr(multiturn, "player_for", lambda *args, **kwargs: player)
    episodes = multiturn.rollout_episodes(
        model,
        tokenizer,
        envs,
        1,
        SamplingConfig(1.0, max_tokens=left[0]),
        max_turns=4,
        max_episode_tokens=budget,
    )
    assert player.caps == [left[0], left[0]]
    cut = episodes[0]
    assert cut.truncated and cut.finish_reason == "max_tokens"
    assert len(cut.tokens) == budget and cut.mask[-1] == 1 and len(cut.turns) == 2
    assert envs[0].steps == 1  # the cut turn never reached its environment
    assert [ep.finish_reason for ep in episodes[1:]] == ["done", "done"]
    assert [env.steps for env in envs[1:]] == [2, 2] and not any(ep.truncated for ep in episodes[1:])


def test_a_turn_that_fills_the_whole_budget_is_cut_before_its_environment(policy):
    """One episode whose first turn runs into its budget: the wave's cap is that budget, the turn is as
    long as the cap and has no end token. The tiny model never ends within 3 tokens here."""
    from mlx_grpo.sampling.multiturn import rollout_episodes
    from mlx_grpo.sampling.rollout import SamplingConfig

    model, tokenizer = policy
    envs = [TwoStepEnv("ok") for _ in range(2)]
    episodes = rollout_episodes(model, tokenizer, envs, 2, SamplingConfig(1.0, max_tokens=8), 4, 3, seed=0)
    assert all(ep.finish_reason == "max_tokens" and len(ep.tokens) == 3 for ep in episodes)
    assert [env.steps for env in envs] == [0, 0]
