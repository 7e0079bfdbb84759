"""reward_takeover and answer_collapse (run/health_rewards.py), and --shaping (tasks/shaping.py)."""

import json
import warnings

import numpy as np
import pytest

from mlx_grpo.files import training_rows
from mlx_grpo.run.health import HealthMonitor, Thresholds
from mlx_grpo.run.health_rewards import answer_pattern, reward_variance_shares
from mlx_grpo.setting_groups import HealthSettings
from mlx_grpo.tasks.shaping import SHAPING, side_shaped_totals


def test_variance_shares_against_a_hand_computation():
    # two groups of 4; main: group 1 varies, group 2 flat; format varies in both
    parts = {"correct": [1, 0, 0, 0, 0, 0, 0, 0], "format": [1, 1, 0, 0, 1, 0, 1, None]}
    got = reward_variance_shares(parts, [1.0, 0.1], 4)
    main = np.var([1, 0, 0, 0]) + 0.0
    side = np.var([0.1, 0.1, 0, 0]) + np.var([0.1, 0, 0.1, 0])
    assert got["reward_share/correct"] == pytest.approx(main / (main + side))
    assert got["reward_share/format"] == pytest.approx(side / (main + side))
    assert got["groups/main_flat_frac"] == 0.5  # group 2: main flat, total varies
    assert reward_variance_shares({"correct": [1, 0]}, [1.0], 2) == {}
    # an environment that totals its own parts (web) gives no weights: no shares claimed, no numpy warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reward_variance_shares({"success": [1, 0, 0, 0], "format": [1, 1, 0, 1]}, [], 2) == {}
    with pytest.raises(ValueError, match="2 rewards .* but 1 weights"):
        side_shaped_totals(parts, [1.0], 4, "gated")
    # gated: group 2's format bonus is not trained on, so it carries only group 1's variance
    gated = reward_variance_shares(parts, [1.0, 0.1], 4, "gated")
    assert gated["reward_share/format"] == pytest.approx(
        np.var([0.1, 0.1, 0, 0]) / (main + np.var([0.1, 0.1, 0, 0]))
    )
    assert gated["groups/main_flat_frac"] == 0.0
    # scaled: the bonus is paid on group 1's right answer only
    scaled = reward_variance_shares(parts, [1.0, 0.1], 4, "scaled")
    assert scaled["reward_share/format"] == pytest.approx(
        np.var([0.1, 0, 0, 0]) / (main + np.var([0.1, 0, 0, 0]))
    )


def test_side_rewards_always_gated_and_scaled_by_hand():
    parts = {"correct": [1, 0, 0, 0, 0, 0, 0, 0], "format": [1, 1, 0, 0, 1, 0, 1, None]}
    np.testing.assert_allclose(
        side_shaped_totals(parts, [1.0, 0.1], 4, "always"), [1.1, 0.1, 0, 0, 0.1, 0, 0.1, 0]
    )
    # gated: group 2's main reward is flat, so its format bonus goes; group 1 keeps it
    np.testing.assert_allclose(
        side_shaped_totals(parts, [1.0, 0.1], 4, "gated"), [1.1, 0.1, 0, 0, 0, 0, 0, 0]
    )
    # scaled: right/wrong main -> the bonus is paid on the right answer only
    np.testing.assert_allclose(side_shaped_totals(parts, [1.0, 0.1], 4, "scaled"), [1.1, 0, 0, 0, 0, 0, 0, 0])
    # a graded main reward (weight 2) and two side rewards: place in the group = (m - min) / (max - min)
    graded = {"score": [0.5, 1.0, 0.0, 0.25], "fmt": [1, 1, 1, 0], "short": [0, 1, 1, 1]}
    main = 2 * np.array([0.5, 1.0, 0.0, 0.25])
    side = np.array([0.3 + 0, 0.3 + 0.2, 0.3 + 0.2, 0 + 0.2])
    place = (main - main.min()) / (main.max() - main.min())
    np.testing.assert_allclose(side_shaped_totals(graded, [2.0, 0.3, 0.2], 4, "scaled"), main + side * place)
    np.testing.assert_allclose(side_shaped_totals(graded, [2.0, 0.3, 0.2], 4, "always"), main + side)


def test_answer_pattern():
    assert answer_pattern(["#### 3", " ####  3", "x"]) == {
        "completion/top_share": 2 / 3,
        "completion/top_answer": "#### 3",
    }


def _gsm8k_like_steps(n=18, seed=0):
    """SmolLM2-135M on GSM8K: 2% right, format 0.02 -> 0.97, completions 201 -> 50 tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(1, n + 1):
        format_rate = 0.02 + (0.97 - 0.02) * min(1.0, step / 10)
        correct = (rng.random(48) < 0.02).astype(float)
        fmt = (rng.random(48) < format_rate).astype(float)
        short = step >= 9
        texts = ["#### 3" if short and rng.random() < 0.9 else f"long reasoning {i}" for i in range(48)]
        rows.append(
            {
                "step": step,
                "reward/correctness/mean": correct.mean(),
                "completion/mean_length": 201 - (151 * min(1.0, step / 12)),
                **reward_variance_shares({"correctness": list(correct), "format": list(fmt)}, [1.0, 0.1], 8),
                **answer_pattern(texts),
            }
        )
    return rows


def _fired(rows, thresholds=None):
    monitor = HealthMonitor(thresholds or Thresholds(HealthSettings(window=5)))
    return {e["rule"]: e for row in rows for e in monitor.observe(row)}


def test_the_gsm8k_run_pattern_fires_both_rules():
    fired = _fired(_gsm8k_like_steps())
    assert "reward_takeover" in fired and "format" in fired["reward_takeover"]["evidence"]
    assert "--shaping gated" in fired["reward_takeover"]["suggestion"]
    assert "answer_collapse" in fired and "'#### 3'" in fired["answer_collapse"]["evidence"]


def test_a_crafted_side_reward_takes_over():
    """Main reward flat in every group (never right), a 0.05-weight side reward varying: it fires on its
    share."""
    rng = np.random.default_rng(1)
    rows = [
        {
            "step": s,
            **reward_variance_shares({"main": [0.0] * 32, "style": list(rng.random(32))}, [1.0, 0.05], 8),
        }
        for s in range(1, 12)
    ]
    fired = _fired(rows)
    assert "style carries 100%" in fired["reward_takeover"]["evidence"]


def test_a_healthy_arith_run_fires_neither(tmp_path):
    """A real run: the embedded model on arith (correctness and format rewards) for 12 steps."""
    from mlx_grpo import make_config
    from mlx_grpo.run.trainer import train

    train(make_config(steps=12, eval_num_problems=8, output=str(tmp_path / "run"), save_every=100))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward_share/correctness_reward" in r for r in rows)  # the metrics the rules read are logged
    events = (
        [json.loads(line) for line in (tmp_path / "run" / "health.jsonl").read_text().splitlines()]
        if (tmp_path / "run" / "health.jsonl").exists()
        else []
    )
    assert not {"reward_takeover", "answer_collapse"} & {e["rule"] for e in events}
    assert not {"reward_takeover", "answer_collapse"} & set(
        _fired(training_rows(rows), Thresholds(HealthSettings(window=4)))
    )


def test_shaping_is_a_checked_setting(tmp_path):
    from mlx_grpo import make_config
    from mlx_grpo.config import ConfigError

    with pytest.raises(ConfigError, match="shaping must be one of always, gated, scaled"):
        make_config(shaping="sometimes")
    from mlx_grpo.run.task_setup import load_task

    with pytest.raises(ConfigError, match="totals its episodes' rewards in its environment: --shaping gated"):
        load_task(make_config(task="web", shaping="gated"))
    from mlx_grpo.config_checks import SHAPING as CONFIG_SHAPING

    assert CONFIG_SHAPING == SHAPING  # config_checks.py sits below tasks/, so it repeats the names


@pytest.mark.parametrize("shaping", ["gated", "scaled"])
def test_the_trainer_trains_on_the_shaped_rewards(tmp_path, shaping):
    """arith with its format reward at weight 0.1: each completion's trained reward, checked from its
    parts."""
    from mlx_grpo import make_config
    from mlx_grpo.run.trainer import train

    out = tmp_path / shaping
    train(
        make_config(
            steps=2,
            shaping=shaping,
            reward=["correctness_reward", "format_reward"],
            reward_weights=[1.0, 0.1],
            runaway_penalty=1.0,
            eval_num_problems=4,
            output=str(out),
        )
    )
    records = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    groups = [records[i : i + 8] for i in range(0, len(records), 8)]
    assert len(groups) == 16
    side_counted = 0
    for group in groups:
        right = [r["rewards"]["correctness_reward"] for r in group]
        varies = len(set(right)) > 1
        for r, c in zip(group, right):
            fmt = 0.1 * r["rewards"]["format_reward"]
            # gated: the bonus where the main reward varies; scaled: on right answers there (c is 0 or 1)
            expected = c + (fmt if varies else 0.0) * (c if shaping == "scaled" else 1.0)
            assert r["reward"] == pytest.approx(expected)
            assert r["raw_reward"] == pytest.approx(c + fmt)
            side_counted += expected != c
    assert side_counted > 0  # the case where the modes differ from plain correctness did occur


def test_the_crafted_side_reward_of_the_shaping_measurement():
    from pathlib import Path

    from mlx_grpo.tasks.rewarding import load_reward_functions

    path = Path(__file__).parent.parent / "examples" / "side_rewards.py"
    main, side = load_reward_functions(str(path), ["correctness_reward", "single_digit_reward"])
    texts = ["3 + 4 = 7\n#### 7", "9 + 7 = 16\n#### 16", "#### -3", "no answer", "#### 12"]
    assert side(None, texts) == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert main(None, texts, answer=["7", "16", "3", "1", "13"]) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_a_step_without_completions_has_no_shares_and_no_warning():
    """A multi-turn step whose parts are empty logs no share (the mean of an empty array would warn and be
    NaN)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reward_variance_shares({"main": [], "side": []}, [1.0, 0.1], 4) == {}
