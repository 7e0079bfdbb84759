"""accuracy_collapse (run/health_rewards.py): the task's accuracy part falls while training goes on."""

import pytest

from mlx_grpo.run import health_rewards
from mlx_grpo.run.health import HealthMonitor, Thresholds
from mlx_grpo.setting_groups import HealthSettings

# An OCaml run on Qwen2.5-Coder-0.5B whose accuracy fell: programs passing every test per step, of 32
PASSED = [15, 14, 5, 2, 0, 2, 0, 0, 0, 0]
REWARDS = [0.51, 0.46, 0.21, 0.14, 0.13, 0.41, 0.23, 0.08, 0.08, 0.35]


def _rows(shares, rewards=None, name="ocaml_passes"):
    rewards = rewards or [0.3] * len(shares)
    return [
        {"step": i + 1, "reward/mean": r, f"reward/{name}/mean": a}
        for i, (a, r) in enumerate(zip(shares, rewards))
    ]


def _events(rows, accuracy="ocaml_passes", window=10):
    monitor = HealthMonitor(Thresholds(HealthSettings(window=window), accuracy_reward=accuracy))
    return [e for row in rows for e in monitor.observe(row) if e["rule"] == "accuracy_collapse"]


def test_the_ocaml_run_fires_at_step_8_with_the_numbers_worked_out():
    events = _events(_rows([p / 32 for p in PASSED], REWARDS))
    assert len(events) == 1
    # by hand: steps 1-4: (15+14+5+2)/128 = 0.281; steps 5-8: (0+2+0+0)/128 = 0.016 <= 0.25 x 0.281 = 0.070.
    # Step 8 is the first with two windows of 4 that do not overlap, and already the recent mean is low
    # enough.
    # Rewards: (0.51+0.46+0.21+0.14)/4 = 0.33, (0.13+0.41+0.23+0.08)/4 = 0.2125
    assert events[0]["step"] == 8
    assert events[0]["evidence"] == (
        "the share of right answers in training (reward/ocaml_passes/mean) fell from 0.28 (steps 1-4) "
        "to 0.02 (steps 5-8) while the mean reward went 0.33 -> 0.21: the reward may be paying for "
        "something other than the task (a hack)"
    )
    assert "docs/health.md" in events[0]["suggestion"]


def test_a_fall_to_just_over_a_quarter_does_not_fire():
    # early 0.4; recent 0.11 > 0.25 x 0.4 = 0.1: not yet a collapse
    assert _events(_rows([0.4] * 4 + [0.11] * 8)) == []
    assert len(_events(_rows([0.4] * 4 + [0.1] * 8))) == 1  # at exactly a quarter it fires


def test_a_learning_run_never_fires():
    shares = [0.1 + 0.5 * i / 19 for i in range(20)]  # 0.1 -> 0.6
    assert _events(_rows(shares)) == []


def test_a_run_flat_and_low_from_the_start_never_fires():
    # early mean 0.035 < 0.1: nothing to lose, even when it reaches 0
    shares = [0.05, 0.02, 0.04, 0.03] + [0.02, 0.05, 0.03, 0.04, 0.02, 0.05] + [0.0] * 6
    assert _events(_rows(shares)) == []


def test_without_the_accuracy_part_it_stays_silent():
    shares = [p / 32 for p in PASSED]
    rows = _rows(shares, REWARDS)
    assert len(_events(rows)) == 1  # the part logged and named: fires (as above)
    assert _events(rows, accuracy=None) == []  # a task without an accuracy reward
    assert (
        _events(rows, accuracy="correctness_reward") == []
    )  # an accuracy reward that is not logged as a part
    # other parts and the total reward collapsing the same way are not the task's accuracy
    assert _events(_rows(shares, shares, name="format")) == []


def test_it_fires_once_while_the_collapse_lasts():
    shares = [p / 32 for p in PASSED] + [0.0] * 20  # 30 steps, collapsed from step 7 to the end
    events = _events(_rows(shares, REWARDS + [0.3] * 20))
    assert [e["step"] for e in events] == [8]


def test_the_constants_are_what_the_docs_say():
    h = health_rewards
    assert (h.ACCURACY_STEPS, h.ACCURACY_FLOOR, h.ACCURACY_FALL) == (4, 0.1, 0.25)


@pytest.mark.parametrize("fall", [0.01, 0.05])
def test_a_stricter_fall_misses_the_ocaml_run(monkeypatch, fall):
    # recent 0.016 is above 0.01 x 0.281 and 0.05 x 0.281 only until the last steps hit 0: then it fires later
    monkeypatch.setattr(health_rewards, "ACCURACY_FALL", fall)
    events = _events(_rows([p / 32 for p in PASSED], REWARDS))
    assert [e["step"] for e in events] == [10]  # steps 7-10 are all 0


def test_the_monitor_of_a_run_is_told_the_accuracy_reward():
    from mlx_grpo.config import TrainConfig

    monitor = HealthMonitor.from_config(TrainConfig(), None, None, "ocaml_passes")
    assert monitor.thresholds.accuracy_reward == "ocaml_passes"
    assert HealthMonitor.from_config(TrainConfig()).thresholds.accuracy_reward is None
