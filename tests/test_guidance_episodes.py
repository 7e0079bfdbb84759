"""--guide on a multi-turn task (run/guidance.py, run/guided_episodes.py): a scripted episode replaces the
last member of each group with no solved episode."""

import json
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.config import ConfigError, TrainConfig, build_config
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run import guidance
from mlx_grpo.run.step_rollouts import rollout_settings
from mlx_grpo.sampling.demonstrations import scripted_episodes
from mlx_grpo.sampling.kinds import MultiTurn, RolloutSettings
from mlx_grpo.sampling.multiturn import episode_scores, make_envs
from mlx_grpo.sampling.rollout import SamplingConfig
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import Task, recommended_settings
from mlx_grpo.update.logprobs import token_logprobs
from rewards.web_browsing import WebEnv
from rewards.web_browsing.tasks import task_from_row

BUDGET = 1500  # max_episode_tokens: a fact/1 script takes about 150 of the tiny model's byte tokens


def _settings(temperature: float, max_episode_tokens: int = BUDGET, max_turns: int = 8) -> RolloutSettings:
    return replace(
        rollout_settings(TrainConfig()),
        group_size=2,
        sampling=SamplingConfig(temperature),
        max_turns=max_turns,
        max_episode_tokens=max_episode_tokens,
    )


def _web_config(tiny_model_path, tmp_path, **extra):
    settings = {
        "task": "web",
        "model": str(tiny_model_path),
        "web_kinds": ["fact/1"],
        "system_prompt": "",
        "steps": 1,
        "batch_size": 2,
        "group_size": 2,
        "max_tokens": 6,
        "max_turns": 2,
        "max_episode_tokens": BUDGET,
        "eval_num_problems": 2,
        "micro_batch_size": 4,
        "save_every": 100,
        "output": str(tmp_path / "run"),
        **extra,
    }
    return build_config(settings, task_defaults=recommended_settings)


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    return load_policy(str(tiny_model_path))


@pytest.fixture(scope="module")
def web(tiny_model_path, tmp_path_factory, policy):
    """The web task, two rows, and a group of two sampled episodes each (a random model solves none)."""
    task = load_task(_web_config(tiny_model_path, tmp_path_factory.mktemp("web")))
    model, tokenizer = policy
    rows = task.train_rows[:2]
    settings = replace(_settings(1.0, max_turns=2), sampling=SamplingConfig(1.0, max_tokens=6))
    episodes, scores, _ = MultiTurn(task).sample_and_score(model, tokenizer, rows, settings, seed=0)
    assert not any(ep.info.get("solved") for ep in episodes)
    return task, rows, episodes, scores


def _oracle_reward(row):
    """The reward of the row's planned actions, played on a WebEnv by hand."""
    env = WebEnv(task_from_row(row))
    env.reset()
    for action in task_from_row(row).oracle_actions():
        _, done, _ = env.step(action)
        if done:
            break
    return env.reward(), env.reward_parts()


def test_every_unsolved_group_gets_its_scripted_episode_scored_and_with_the_policys_logprobs(web, policy):
    task, rows, episodes, scores = web
    model, tokenizer = policy
    guided, rescored = guidance.guide_groups(model, tokenizer, task, rows, episodes, scores, _settings(0.7))
    for i, row in enumerate(rows):
        ep, sampled = guided[2 * i + 1], episodes[2 * i + 1]
        [script] = scripted_episodes(
            tokenizer, make_envs(task, [row], 1), [task.reference_actions(row)], task.system_prompt, BUDGET
        )
        assert ep.guided and not guided[2 * i].guided and guided[2 * i] is episodes[2 * i]
        assert ep.prompt_index == sampled.prompt_index == i and ep.prompt_tokens == sampled.prompt_tokens
        assert ep.tokens == script.tokens and ep.mask == script.mask and ep.finish_reason == "done"
        assert 0.0 in ep.mask and 1.0 in ep.mask  # pages between the turns, read only
        # scored by its environment, as a sampled episode is: the plan's full reward
        reward, parts = _oracle_reward(row)
        assert ep.reward == rescored.total[2 * i + 1] == pytest.approx(reward) and parts["success"] == 1.0
        assert {name: values[2 * i + 1] for name, values in rescored.parts.items()} == parts
        assert rescored.total[2 * i] == scores.total[2 * i]
        # behaviour log-probs: the policy's at the sampling temperature on the model's turns, 0 on the pages
        whole = mx.array([ep.prompt_tokens + ep.tokens])
        expected = np.array(token_logprobs(model, whole, 0.7)[0][0, len(ep.prompt_tokens) - 1 :])
        mask = np.array(ep.mask) == 1.0
        np.testing.assert_allclose(np.array(ep.logprobs)[mask], expected[mask], rtol=1e-5, atol=1e-5)
        assert np.all(np.array(ep.logprobs)[~mask] == 0.0) and np.all(expected[mask] < 0)
    assert (
        not any(ep.guided for ep in episodes)
        and scores.total.tolist() == episode_scores(episodes).total.tolist()
    )


def test_a_group_with_a_solved_episode_is_left_as_sampled(web, policy):
    task, rows, episodes, _ = web
    model, tokenizer = policy
    [solved] = scripted_episodes(
        tokenizer, make_envs(task, rows[:1], 1), [task.reference_actions(rows[0])], task.system_prompt, BUDGET
    )
    mixed = [replace(solved, prompt_index=0)] + episodes[1:]  # row 0's first member solved it
    guided, rescored = guidance.guide_groups(
        model, tokenizer, task, rows, mixed, episode_scores(mixed), _settings(1.0)
    )
    assert guided[:2] == mixed[:2] and [ep.guided for ep in guided] == [False, False, False, True]
    assert rescored.total[:2].tolist() == episode_scores(mixed).total[:2].tolist()


def test_a_row_whose_script_fails_or_is_missing_keeps_its_group_as_sampled(web, policy):
    task, rows, episodes, scores = web
    model, tokenizer = policy
    # a budget the script cannot finish in: it ends "max_tokens", not "done"
    guided, rescored = guidance.guide_groups(
        model, tokenizer, task, rows, episodes, scores, _settings(1.0, 100)
    )
    assert guided == episodes and rescored is scores
    # no script for row 0; row 1's is played
    unscripted = replace(
        task, reference_actions=lambda row: None if row is rows[0] else task.reference_actions(row)
    )
    guided, _ = guidance.guide_groups(model, tokenizer, unscripted, rows, episodes, scores, _settings(1.0))
    assert guided[:3] == episodes[:3] and guided[3].guided
    # a script its environment fails on
    broken = replace(task, make_env=lambda row: _Failing(task.make_env(row)))
    guided, _ = guidance.guide_groups(model, tokenizer, broken, rows, episodes, scores, _settings(1.0))
    assert guided == episodes
    # a script that ends its episode with a wrong answer: done, not solved
    wrong = replace(task, reference_actions=lambda row: task.reference_actions(row)[:-1] + ["answer[not it]"])
    assert all(
        ep.finish_reason == "done" and not ep.info.get("solved")
        for ep in scripted_episodes(
            tokenizer,
            make_envs(task, rows, 1),
            [wrong.reference_actions(r) for r in rows],
            task.system_prompt,
            BUDGET,
        )
    )
    guided, _ = guidance.guide_groups(model, tokenizer, wrong, rows, episodes, scores, _settings(1.0))
    assert guided == episodes
    # more actions than the run's max_turns: an episode its rollouts could never play
    assert all(len(task.reference_actions(r)) > 1 for r in rows)
    guided, _ = guidance.guide_groups(
        model, tokenizer, task, rows, episodes, scores, _settings(1.0, max_turns=1)
    )
    assert guided == episodes


class _Failing:
    """A web environment that breaks on the first answer."""

    def __init__(self, env):
        self.env = env

    def reset(self):
        return self.env.reset()

    def step(self, action):
        if action.startswith("answer["):
            raise RuntimeError("boom")
        return self.env.step(action)

    def reward(self):
        return self.env.reward()


def test_guidance_accepts_a_scripted_episode_task_and_refuses_one_without_scripts(tiny_model_path, tmp_path):
    guidance.check_guidance(load_task(_web_config(tiny_model_path, tmp_path)))
    rows = [{"prompt": "a"}]
    counting = Task("counting", rows, rows, [], [], None, None, [], make_env=lambda row: None)
    with pytest.raises(ConfigError, match="--guide needs scripted episodes: task 'counting' plays episodes"):
        guidance.check_guidance(counting)
    with pytest.raises(ConfigError, match="needs scripted episodes"):
        guidance.check_guidance(replace(counting, reference_actions=lambda row: None))


def test_a_guided_web_run_trains_and_logs_the_scripted_episodes(tiny_model_path, tmp_path):
    from mlx_grpo.run.trainer import train

    result = train(_web_config(tiny_model_path, tmp_path, guide=True, guide_negatives=False))
    records = [json.loads(x) for x in (result.run_dir / "completions.jsonl").read_text().splitlines()]
    assert [bool(r.get("guided")) for r in records] == [False, True] * 2  # the random model solves nothing
    assert all(r["rewards"]["success"] == 1.0 and r["advantage"] > 0 for r in records if r.get("guided"))
    assert all(r["advantage"] == 0.0 for r in records if not r.get("guided"))
    [first] = result.history
    assert first["guide/groups_frac"] == 1.0 and first["guide/sampled_accuracy"] == 0.0
    assert np.isfinite(first["grad_norm"]) and first["grad_norm"] > 0


def test_a_guide_spells_out_the_tokens_its_head_cannot_tell_apart_as_sft_does(web, policy, monkeypatch):
    from mlx_grpo.run import guided_episodes

    task, rows, episodes, scores = web
    model, tokenizer = policy
    seen = []

    def recording(*args):
        seen.append(args[-1])
        return scripted_episodes(*args)

    monkeypatch.setattr(guided_episodes, "indistinct_tokens", lambda m, t: {7: "<tool_call>"})
    monkeypatch.setattr(guided_episodes, "scripted_episodes", recording)
    guided, _ = guidance.guide_groups(model, tokenizer, task, rows, episodes, scores, _settings(1.0))
    assert seen == [{7: "<tool_call>"}] and guided[1].guided
