import numpy as np
import pytest

from mlx_grpo.update.advantages import advantage_stats, group_advantages, zero_std_frac


def test_group_mean_baseline_by_hand():
    # two groups of 3: means 1/3 and 2
    adv = group_advantages([1.0, 0.0, 0.0, 1.0, 2.0, 3.0], group_size=3)
    np.testing.assert_allclose(adv, [2 / 3, -1 / 3, -1 / 3, -1.0, 0.0, 1.0])


def test_group_scaling_by_hand():
    # group [0, 1, 0, 1]: mean 0.5, population std 0.5 -> advantages +-1 (eps aside)
    adv = group_advantages([0, 1, 0, 1], group_size=4, scale="group", eps=0.0)
    np.testing.assert_allclose(adv, [-1, 1, -1, 1])


def test_batch_scaling_uses_whole_batch_std():
    rewards = [0.0, 2.0, 10.0, 10.0]
    adv = group_advantages(rewards, group_size=2, scale="batch", eps=0.0)
    # centred per group: [-1, 1, 0, 0]; batch std of the raw rewards = sqrt(mean((r-5.5)^2))
    std = np.sqrt(np.mean((np.array(rewards) - 5.5) ** 2))
    np.testing.assert_allclose(adv, np.array([-1, 1, 0, 0]) / std)


def test_equal_rewards_give_zero_advantage_and_count_as_zero_std():
    rewards = [0.5, 0.5, 0.0, 1.0]
    adv = group_advantages(rewards, group_size=2, scale="group")
    np.testing.assert_allclose(adv[:2], [0.0, 0.0])
    stats = advantage_stats(adv)
    assert zero_std_frac(rewards, 2) == 0.5
    assert stats["advantage/max"] == pytest.approx(0.5 / (0.5 + 1e-4))


def test_similar_rewards_blow_up_under_group_scaling():
    # seed 004's example: std ~0.03 amplifies advantages far beyond the reward spread
    rewards = [0.62, 0.68, 0.71, 0.65]
    plain = group_advantages(rewards, 4)
    scaled = group_advantages(rewards, 4, scale="group")
    assert np.abs(plain).max() < 0.06
    assert np.abs(scaled).max() > 1.2


def test_rejects_ragged_batches_and_unknown_modes():
    with pytest.raises(ValueError):
        group_advantages([1.0, 2.0, 3.0], group_size=2)
    with pytest.raises(ValueError):
        group_advantages([1.0, 2.0], group_size=2, scale="std")
