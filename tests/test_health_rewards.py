"""reward_takeover and answer_collapse (run/health_rewards.py), and --shaping gated (tasks/shaping.py)."""

import json

import numpy as np
import pytest

from mlx_grpo.run.health import HealthMonitor, Thresholds
from mlx_grpo.run.health_rewards import answer_pattern, reward_variance_shares
from mlx_grpo.tasks.shaping import gated_totals


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


def test_gated_totals_drop_side_rewards_where_the_main_one_is_flat():
    parts = {"correct": [1, 0, 0, 0, 0, 0, 0, 0], "format": [1, 1, 0, 0, 1, 0, 1, None]}
    np.testing.assert_allclose(gated_totals(parts, [1.0, 0.1], 4), [1.1, 0.1, 0, 0, 0, 0, 0, 0])


def test_answer_pattern():
    assert answer_pattern(["#### 3", " ####  3", "x"]) == {"completion/top_share": 2 / 3, "completion/top_answer": "#### 3"}


def _gsm8k_like_steps(n=18, seed=0):
    """The SmolLM2 GSM8K run of issue 27: 2% right, format 0.02 -> 0.97, completions 201 -> 50 tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(1, n + 1):
        format_rate = 0.02 + (0.97 - 0.02) * min(1.0, step / 10)
        correct = (rng.random(48) < 0.02).astype(float)
        fmt = (rng.random(48) < format_rate).astype(float)
        short = step >= 9
        texts = ["#### 3" if short and rng.random() < 0.9 else f"long reasoning {i}" for i in range(48)]
        rows.append({"step": step, "reward/correctness/mean": correct.mean(),
                     "completion/mean_length": 201 - (151 * min(1.0, step / 12)),
                     **reward_variance_shares({"correctness": list(correct), "format": list(fmt)}, [1.0, 0.1], 8),
                     **answer_pattern(texts)})
    return rows


def _fired(rows, thresholds=None):
    monitor = HealthMonitor(thresholds or Thresholds(window=5))
    return {e["rule"]: e for row in rows for e in monitor.observe(row)}


def test_the_gsm8k_run_pattern_fires_both_rules():
    fired = _fired(_gsm8k_like_steps())
    assert "reward_takeover" in fired and "format" in fired["reward_takeover"]["evidence"]
    assert "--shaping gated" in fired["reward_takeover"]["suggestion"]
    assert "answer_collapse" in fired and "'#### 3'" in fired["answer_collapse"]["evidence"]


def test_a_crafted_side_reward_takes_over():
    """Main reward flat in every group (never right), a 0.05-weight side reward varying: it fires on its share."""
    rng = np.random.default_rng(1)
    rows = [{"step": s, **reward_variance_shares({"main": [0.0] * 32, "style": list(rng.random(32))}, [1.0, 0.05], 8)}
            for s in range(1, 12)]
    fired = _fired(rows)
    assert "style carries 100%" in fired["reward_takeover"]["evidence"]


def test_a_healthy_arith_run_fires_neither(tmp_path):
    """A real run: the embedded model on arith (correctness and format rewards) for 12 steps."""
    from mlx_grpo import make_config
    from mlx_grpo.run.trainer import train

    train(make_config(steps=12, eval_num_problems=8, output=str(tmp_path / "run"), save_every=100))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward_share/correctness_reward" in r for r in rows)  # the metrics the rules read are logged
    events = [json.loads(line) for line in (tmp_path / "run" / "health.jsonl").read_text().splitlines()] \
        if (tmp_path / "run" / "health.jsonl").exists() else []
    assert not {"reward_takeover", "answer_collapse"} & {e["rule"] for e in events}
    assert not {"reward_takeover", "answer_collapse"} & set(_fired(rows, Thresholds(window=4)))


def test_shaping_is_a_checked_setting(tmp_path):
    from mlx_grpo import make_config
    from mlx_grpo.config import ConfigError
    from mlx_grpo.run.trainer import train

    with pytest.raises(ConfigError, match="shaping must be always or gated"):
        make_config(shaping="sometimes")
    result = train(make_config(steps=2, shaping="gated", eval_num_problems=4, output=str(tmp_path / "g")))
    assert result.accuracy_after is not None
