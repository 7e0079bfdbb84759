"""The algorithm options end to end: reward shaping and group filters worked by
hand, the update equal to REINFORCE on-policy and changed by clipping off-policy,
and every option surviving a resumed run bit for bit."""

import json

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map
from mlx_grpo.tasks.shaping import groups_to_keep, overlong_penalty, runaway_penalty, shape_rewards
from test_train_resume import Interrupt, custom_run  # noqa: F401  (a fixture)
from test_trainer import _completions

from mlx_grpo.config import build_config
from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.trainer import refreshed_reference, train, update_settings
from mlx_grpo.update.step import update
from mlx_grpo.update.batch import build_batch, micro_batches
from mlx_grpo.update.logprobs import completion_logprobs
from mlx_grpo.update.losses import BatchShape


def _completion_logprobs(model, mb, config, differentiated=False):
    # differentiated: the head's gradient taken the trainer's way, so that a gradient is compared to
    # the trainer's to the last bit, not to float32 rounding (tests/test_logprobs.py checks that way)
    return completion_logprobs(
        model,
        mb.prompts,
        mb.left_padding,
        mb.completions,
        mb.group_size,
        config.sampling.temperature,
        differentiated=differentiated,
    )


def test_runaway_penalty_multiplies_and_keeps_the_ranking():
    rewards = [1.0, 0.6, 0.5, -1.0, 0.0]
    truncated = [True, True, False, True, True]
    np.testing.assert_allclose(runaway_penalty(rewards, truncated, 0.3), [0.3, 0.18, 0.5, -1.7, 0.0])
    # within a group of runaways the better one stays better (a cap would tie them)
    shaped = runaway_penalty([0.9, 0.4, 0.7], [True, True, True], 0.3)
    assert list(np.argsort(shaped)) == [1, 2, 0] and shaped.std() > 0
    np.testing.assert_allclose(runaway_penalty(rewards, truncated, 1.0), rewards)


def test_overlong_penalty_is_dapo_eq_13():
    # max_tokens 20, buffer 5: free up to 15 tokens, then linear down to -1 at 20
    np.testing.assert_allclose(overlong_penalty([10, 15, 16, 18, 20], 20, 5), [0, 0, -0.2, -0.6, -1.0])
    np.testing.assert_allclose(overlong_penalty([16, 20], 20, 5, penalty=0.5), [-0.1, -0.5])
    np.testing.assert_allclose(overlong_penalty([20], 20, 0), [0.0])
    shaped = shape_rewards(
        [1.0, 1.0], [20, 10], [True, False], max_tokens=20, runaway_factor=0.3, overlong_buffer=5
    )
    np.testing.assert_allclose(shaped, [0.3 - 1.0, 1.0])


def test_group_filters():
    rewards = [1, 1, 1, 0, 1, 0, 0.2, 0.1, 0.1, 0, 0, 0]
    np.testing.assert_array_equal(groups_to_keep(rewards, 3), [True] * 4)
    np.testing.assert_array_equal(groups_to_keep(rewards, 3, drop_equal=True), [False, True, True, False])
    np.testing.assert_array_equal(
        groups_to_keep(rewards, 3, reward_threshold=0.5), [True, True, False, False]
    )
    np.testing.assert_array_equal(
        groups_to_keep(rewards, 3, drop_equal=True, reward_threshold=0.5), [False, True, False, False]
    )


def _on_policy_parts(model, config, seed=3):
    """Micro-batches whose behaviour log-probs are exactly the current policy's: ratio 1."""
    rng = np.random.default_rng(seed)
    comps = _completions(rng, 4, 3)
    advantages = rng.normal(0, 1, 12)
    parts = micro_batches(build_batch(comps, advantages, 3), 6)
    for mb in parts:
        mb.behaviour_logp = mx.stop_gradient(_completion_logprobs(model, mb, config)[0])
    sizes = BatchShape(
        12, int(sum(mb.mask.sum().item() for mb in parts)), len(parts), config.sampling.max_tokens
    )
    return parts, sizes


def _fresh_policy(path):
    model, _ = load_policy(str(path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4})
    # non-zero lora_b: the adapter path carries gradient into lora_a too
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.05, model.trainable_parameters()))
    return model


def _weights(model):
    return {k: np.array(v) for k, v in tree_flatten(model.trainable_parameters())}


def test_one_iteration_is_reinforce_and_more_iterations_clip(tiny_model_path):
    # Plain SGD makes "same update" mean "same gradient" (Adam's first step is ~sign(g)).
    base = {
        "group_size": 3,
        "lr": 1.0,
        "micro_batch_size": 6,
        "warmup_steps": 0,
        "steps": 2,
        "max_grad_norm": 1e6,
    }
    results = {}
    for iterations in (1, 3):
        for eps in (1e-3, 10.0):
            config = build_config(
                {**base, "num_iterations": iterations, "epsilon_low": min(eps, 0.99), "epsilon_high": eps}
            )
            model = _fresh_policy(tiny_model_path)
            parts, sizes = _on_policy_parts(model, config)
            metrics = update(
                model, optim.SGD(learning_rate=config.lr), update_settings(config), sizes, parts, None, None
            )
            results[iterations, eps] = (_weights(model), metrics)

    # One update on fresh rollouts: the ratio is 1, the clip never fires, and the
    # step is REINFORCE's: the gradient of -A * (token mean of logp), averaged over sequences.
    (tight, m_tight), (loose, _) = results[1, 1e-3], results[1, 10.0]
    assert m_tight["clip_fraction"] == 0
    for name in tight:
        np.testing.assert_array_equal(tight[name], loose[name])
    config = build_config({**base, "num_iterations": 1})
    model = _fresh_policy(tiny_model_path)
    parts, sizes = _on_policy_parts(model, config)

    def reinforce(model):
        total = 0.0
        for mb in parts:
            logp, _ = _completion_logprobs(model, mb, config, differentiated=True)
            seq_mean = (logp * mb.mask).sum(axis=1) / mb.mask.sum(axis=1)
            total = total + (-mb.advantages * seq_mean).sum() / 12
        return total

    _, grads = nn.value_and_grad(model, reinforce)(model)
    optim.SGD(learning_rate=config.lr).update(model, grads)
    for name, value in _weights(model).items():
        np.testing.assert_allclose(tight[name], value, rtol=1e-5, atol=1e-7, err_msg=name)

    # Reusing the rollouts: the ratio moves away from 1, the tight clip fires and changes the update.
    (tight, m_tight), (loose, m_loose) = results[3, 1e-3], results[3, 10.0]
    assert m_tight["clip_fraction"] > 0.1 > m_loose["clip_fraction"]
    assert any(not np.allclose(tight[n], loose[n], atol=1e-6) for n in tight)


def test_reference_refresh_mixes_toward_the_policy():
    reference = {"w": mx.array([0.0, 1.0])}
    policy = {"w": mx.array([1.0, 3.0])}
    np.testing.assert_allclose(np.array(refreshed_reference(reference, policy, 0.6)["w"]), [0.6, 2.2])
    np.testing.assert_allclose(np.array(refreshed_reference(reference, policy, 1.0)["w"]), [1.0, 3.0])


OPTION_SETS = {
    "dynamic-sampling": dict(dynamic_sampling=True, resample_rounds=2, reward_threshold=0.2, loss="dapo"),
    "cispo-refresh": dict(
        loss="cispo", epsilon_high=0.28, beta=0.05, ref_refresh_every=1, ref_refresh_alpha=0.5
    ),
    # Stops at common letters, so that some completions end and others are cut (and masked) whatever the
    # draws.
    "gspo-entropy": dict(
        loss="gspo",
        entropy_coef=0.01,
        entropy_top_quantile=0.5,
        mask_truncated=True,
        overlong_buffer=4,
        stop=list("etaoinsr"),
    ),
    "sapo-delta": dict(loss="sapo", scale_rewards="group"),
    "grpo-delta": dict(loss="grpo", delta=1.5, scale_rewards="batch", runaway_penalty=0.5),
}


@pytest.mark.parametrize("fine_tune_type", ["lora", "full"])
def test_kl_watch_sees_the_policy_leave_the_starting_weights(fine_tune_type, tmp_path, custom_run):  # noqa: F811
    result = train(custom_run(tmp_path / "run", fine_tune_type=fine_tune_type, kl_every=1, steps=3, lr=3e-2))
    kls = [m["kl"] for m in result.history]
    assert kls[0] == 0.0  # step 1 samples from the starting weights: the reference itself
    # Full fine-tuning has no adapters to switch off: without a kept copy of the starting
    # weights its "reference" was the policy itself, and this read ~0 at every step.
    assert kls[-1] > 1e-4, kls


@pytest.mark.parametrize("name", OPTION_SETS)
def test_options_train_and_resume_bitwise(name, tmp_path, custom_run):  # noqa: F811
    options = OPTION_SETS[name]
    straight = train(custom_run(tmp_path / "straight", **options))

    def stop_after_first_checkpoint(kind, data):
        if kind == "checkpoint" and data["step"] == 2:
            raise Interrupt

    interrupted = tmp_path / "interrupted"
    with pytest.raises(Interrupt):
        train(custom_run(interrupted, **options), on_event=stop_after_first_checkpoint)
    resumed = train(custom_run(interrupted, resume=str(interrupted), **options))

    a = mx.load(str(straight.run_dir / "adapters.safetensors"))
    b = mx.load(str(resumed.run_dir / "adapters.safetensors"))
    for key in a:
        assert np.array_equal(np.array(a[key]), np.array(b[key])), key
    metrics = [m for m in straight.history]
    assert all(np.isfinite(m["loss"]) for m in metrics)
    assert any(np.abs(np.array(v)).max() > 0 for k, v in a.items() if k.endswith("lora_b"))
    for m in metrics:
        assert 0 <= m["filter/dropped_frac"] <= 1
        assert m["entropy"] is None or m["entropy"] > 0
    if options.get("dynamic_sampling"):
        records = [json.loads(x) for x in (straight.run_dir / "completions.jsonl").read_text().splitlines()]
        rounds = [m["filter/rounds"] for m in metrics]
        assert all(1 <= r <= 3 for r in rounds)
        # a dropped group is recorded, with no advantage, and each step trains on at most batch_size groups
        trained = [r for r in records if r["advantage"] is not None]
        assert len(records) == sum(rounds) * 2 * 4
        for step in {r["step"] for r in records}:
            assert len([r for r in trained if r["step"] == step]) <= 2 * 4
    if options.get("ref_refresh_every"):
        assert all(m.get("ref_refreshed") for m in metrics)
        assert all(m["kl"] is not None for m in metrics)


def test_pass_at_k_evaluation_counts_any_right_sample(tiny_model_path, monkeypatch):
    """eval/pass@k with n = k samples is the fraction of problems with at least one right sample."""
    from types import SimpleNamespace

    from mlx_grpo.sampling import heldout as evaluate

    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(3)]
    # problem 0: no right sample; 1: one of two; 2: both
    verdicts = iter([0.0, 0.0, 1.0, 0.0, 1.0, 1.0])

    def reward(prompts, completions, **kw):
        return [next(verdicts) for _ in completions]

    task = SimpleNamespace(eval_rows=rows, accuracy_reward=reward, system_prompt=None)
    model, tokenizer = load_policy(str(tiny_model_path))
    assert evaluate.evaluate_pass_at_k(model, tokenizer, task, 2, 4, 1.0) == pytest.approx(2 / 3)
