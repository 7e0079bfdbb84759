"""Trainer.update takes groups a user sampled and scored the same way train's step takes its own:
the same reward shaping and group filters on the raw rewards, advantages, truncation mask, token
budget, micro-batches and optimizer step (skipped without signal)."""

import numpy as np
import pytest
from mlx.utils import tree_flatten

import mlx_grpo
from mlx_grpo.run import trainer as run_trainer


def _weights(model) -> dict:
    return {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


def test_a_group_without_signal_after_one_with_signal_moves_no_adapter_weight():
    """AdamW's moments from the first update would move the weights on the second's zero gradient.
    runaway_penalty 1: equal raw rewards stay equal whichever completions are cut."""
    trainer = mlx_grpo.Trainer(
        batch_size=1, group_size=4, max_tokens=16, lr=1e-3, warmup_steps=0, runaway_penalty=1.0
    )
    row = trainer.task.train_rows[0]
    group = trainer.sample(row["prompt"])
    first = trainer.update([row], group, [1.0, 0.0, 0.0, 0.0])
    assert first["grad_norm"] > 0 and not first["update/skipped"]
    before = _weights(trainer.model)
    flat = trainer.update([row], group, [0.5, 0.5, 0.5, 0.5])
    assert flat["update/no_signal"] and flat["update/skipped"] and flat["skipped_updates"] == 1
    assert _same(before, _weights(trainer.model))
    assert [m["step"] for m in trainer.history] == [1, 2]  # each update is a step of the run


def test_cut_completions_train_nothing_under_mask_truncated():
    """Every completion hits max_tokens: with mask_truncated no token is trained, so nothing moves."""
    trainer = mlx_grpo.Trainer(
        batch_size=1,
        group_size=4,
        max_tokens=2,
        lr=1e-2,
        warmup_steps=0,
        mask_truncated=True,
        temperature=1.0,
    )
    row = trainer.task.train_rows[0]
    group = trainer.sample(row["prompt"])
    assert all(c.truncated for c in group)
    before = _weights(trainer.model)
    metrics = trainer.update([row], group, [1.0, 0.0, 0.5, 0.0])
    assert metrics["update/no_signal"] and metrics["update/skipped"]
    assert _same(before, _weights(trainer.model))


def test_an_episode_update_normalises_by_the_episode_budget(tiny_model_path):
    """dr_grpo divides the token sum by sequences x the task's token budget (max_episode_tokens for an
    episode, not max_tokens): doubling that budget halves the gradient of the same episodes."""
    from mlx_grpo.sampling.kinds import rollouts_for
    from mlx_grpo.run.step_rollouts import rollout_settings

    settings = dict(
        task="web",
        model=str(tiny_model_path),
        batch_size=1,
        group_size=2,
        max_tokens=6,
        max_turns=2,
        web_kinds=["fact/1"],
        system_prompt="",
        loss="dr_grpo",
        max_grad_norm=1e9,
        eval_num_problems=2,
    )
    small = mlx_grpo.Trainer(max_episode_tokens=1500, **settings)
    large = mlx_grpo.Trainer(max_episode_tokens=3000, **settings)
    rows = small.task.train_rows[:1]
    episodes, _, _ = rollouts_for(small.task).sample_and_score(
        small.model, small.tokenizer, rows, rollout_settings(small.config), 0, 0
    )
    assert all(e.model_tokens < 1500 for e in episodes)  # the same episodes under either budget
    norms = [t.update(rows, episodes, [1.0, 0.0])["grad_norm"] for t in (small, large)]
    assert norms[1] > 0 and norms[0] / norms[1] == pytest.approx(2.0, rel=1e-4)


def _stepped_and_sampled(monkeypatch, settings):
    """A Trainer after one train step, and what that step sampled (its StepRollouts)."""
    sampled, collect = [], run_trainer.collect_rollouts

    def collect_and_keep(*args):
        sampled.append(collect(*args))
        return sampled[-1]

    monkeypatch.setattr(run_trainer, "collect_rollouts", collect_and_keep)
    stepped = mlx_grpo.Trainer(**settings)
    by_step = stepped.step()
    monkeypatch.undo()
    (step,) = sampled
    return stepped, by_step, step


def test_train_step_and_trainer_update_shape_the_same_raw_rewards_the_same_way(monkeypatch, variety_task):
    """Both take the scorer's raw rewards; the runaway penalty (default 0.3) on the truncated completions and
    the overlong penalty are applied by each, so the same groups move the weights the same way. The variety
    reward pays a cut completion too, so the runaway penalty changes its reward."""
    settings = dict(
        batch_size=2,
        group_size=4,
        max_tokens=12,
        lr=1e-2,
        warmup_steps=0,
        micro_batch_size=3,
        seed=3,
        overlong_buffer=4,
        **variety_task,
    )
    stepped, by_step, step = _stepped_and_sampled(monkeypatch, settings)
    assert step.keep.all()
    cut = np.array([c.finish_reason == "length" for c in step.completions])
    assert any(
        cut.reshape(-1, 4).any(axis=1) & ~cut.reshape(-1, 4).all(axis=1)
    )  # a group of cut and ended ones
    assert (step.raw_rewards[cut] > 0).any()  # where the penalty fires
    assert not np.allclose(step.rewards - step.rewards.mean(), step.raw_rewards - step.raw_rewards.mean())

    updated = mlx_grpo.Trainer(**settings)
    by_update = updated.update(step.rows, step.completions, step.raw_rewards)
    assert by_update["grad_norm"] == by_step["grad_norm"] and by_update["step"] == by_step["step"] == 1
    assert (
        by_update["reward/mean"] == by_step["reward/mean"]
        and by_update["reward/raw_mean"] == by_step["reward/raw_mean"]
    )
    assert _same(_weights(stepped.model), _weights(updated.model))
    assert not _same(_weights(updated.model), _weights(mlx_grpo.Trainer(**settings).model))


def test_a_group_the_run_filters_out_is_left_out_of_the_update():
    """gated shaping and dynamic_sampling as train's step applies them: the second group's main reward is
    flat, so its side reward is gated away, the group is flat and dropped; the update is the first group's
    alone."""
    settings = dict(
        batch_size=2,
        group_size=4,
        max_tokens=8,
        lr=1e-2,
        warmup_steps=0,
        shaping="gated",
        dynamic_sampling=True,
        runaway_penalty=1.0,
        reward_weights=[1.0, 0.5],
    )
    alone, both = mlx_grpo.Trainer(**settings), mlx_grpo.Trainer(**settings)
    first, second = alone.task.train_rows[:2]
    group, other = alone.sample(first["prompt"]), alone.sample(second["prompt"])
    main, side = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    total = np.array(main) + 0.5 * np.array(side)
    scores = mlx_grpo.Scores(total, {"correctness_reward": main, "format_reward": side})
    by_both = both.update([first, second], group + other, scores)
    by_alone = alone.update(
        [first],
        group,
        mlx_grpo.Scores(total[:4], {"correctness_reward": main[:4], "format_reward": side[:4]}),
    )
    assert by_both["grad_norm"] == by_alone["grad_norm"] > 0
    assert _same(_weights(alone.model), _weights(both.model))
    with pytest.raises(ValueError, match="pass the Scores"):  # totals cannot be gated
        both.update([first], group, total[:4])


def test_groups_of_another_size_are_their_own_groups_and_bad_shapes_are_refused():
    trainer = mlx_grpo.Trainer(batch_size=1, group_size=4, max_tokens=8, lr=1e-3, warmup_steps=0)
    row = trainer.task.train_rows[0]
    group = trainer.sample(row["prompt"], group_size=3)
    metrics = trainer.update(
        [row], group, [1.0, 0.0, 0.0]
    )  # one group of three: its own mean is the baseline
    assert metrics["grad_norm"] > 0
    with pytest.raises(ValueError, match="at least 2 completions"):
        trainer.update([row, row], group[:2], [1.0, 0.0])
    with pytest.raises(ValueError, match="one number per completion"):
        trainer.update([row], group, [1.0, 0.0])
    with pytest.raises(ValueError, match="equal-sized group"):
        trainer.update([row, row], group, [1.0, 0.0, 0.0])
