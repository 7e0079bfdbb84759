"""Health rules: each fires on a metric stream built to trigger it and stays quiet on a
healthy one; the display prints a health event once. The non-finite guard in a real run is
tests/test_health_guard.py's."""

import io
import math

import mlx.core as mx
import numpy as np
import pytest
from rich.console import Console

from mlx_grpo.setting_groups import HealthSettings
from mlx_grpo.run.display import TrainDisplay, metrics_table, trend
from mlx_grpo.run.health import RULES, HealthMonitor, Thresholds
from mlx_grpo.run.health_checks import fitted_trend
from mlx_grpo.update.step import relative_change

STEPS = 60


def healthy(step: int, rng) -> dict:
    """One step of a run that learns steadily: reward rising, nothing near a limit."""
    return {
        "step": step,
        "loss": float(rng.normal(0, 0.01)),
        "grad_norm": float(0.3 + rng.uniform(0, 0.1)),
        "grad_clipped": False,
        "frac_zero_std": 0.25,
        "reward/mean": 0.3 + 0.005 * step + float(rng.normal(0, 0.02)),
        "reward/std": 0.4,
        "reward/best_of_n": 0.9,
        "reward/min": 0.0,
        "reward/max": 1.0,
        "kl": 0.001 * step if step % 10 == 0 else None,
        "entropy": 0.5 + float(rng.normal(0, 0.02)),
        "completion/truncated_frac": 0.05,
        "completion/mean_length": 40.0,
        "advantage/min": -0.6,
        "advantage/max": 0.7,
        "advantage/abs_mean": 0.3,
        "lr": 1e-5,
        "update/rel_change": 1e-3,
        "skipped_updates": 0,
    }


def run(stream, **thresholds) -> list[dict]:
    monitor = HealthMonitor(
        Thresholds(HealthSettings(**thresholds), lr=1e-5, token_budget=64, accuracy_reward="correct")
    )
    return [e for m in stream for e in monitor.observe(m)]


def stream(change, start: int = 30, seed: int = 0) -> list[dict]:
    """A healthy stream whose steps from `start` on are altered by change(metrics, step)."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(1, STEPS + 1):
        m = healthy(step, rng)
        if step >= start:
            change(m, step)
        out.append(m)
    return out


def test_healthy_stream_is_quiet():
    for seed in range(3):
        assert run(stream(lambda m, s: None, seed=seed)) == []


def set_(**values):
    return lambda m, s: m.update(values)


def falling_reward(m, s):
    m["reward/mean"] = 0.6 - 0.02 * (s - 30)


def kl_growing(m, s):
    m["kl"] = 0.2 * (s - 29) if s % 5 == 0 else None


def loss_jump(m, s):
    m["loss"] = 0.5 + 0.01 * math.sin(s)


def entropy_falls(m, s):
    m["entropy"] = 0.02


def spike(m, s):
    if s == 40:
        m["grad_norm"] = 54_648_652.0


CASES = {
    "reward_takeover": set_(
        **{"reward_share/correct": 0.1, "reward_share/format": 0.9, "groups/main_flat_frac": 0.2}
    ),
    "answer_collapse": set_(**{"completion/top_share": 0.9, "completion/top_answer": "#### 3"}),
    # right answers 0.4 -> 0 from step 40 (health_rewards.py; tests/test_health_accuracy.py has more)
    "accuracy_collapse": lambda m, s: m.update({"reward/correct/mean": 0.4 if s < 40 else 0.0}),
    "grad_at_clip": set_(grad_norm=1.0, grad_clipped=True),
    "grad_spike": spike,
    "zero_std": set_(frac_zero_std=0.75),
    "reward_collapse": set_(
        loss=0.0, grad_norm=0.0, **{"reward/std": 0.0, "reward/mean": 0.05, "frac_zero_std": 1.0}
    ),
    "reward_down": falling_reward,
    "loss_spike": loss_jump,
    "kl_runaway": kl_growing,
    "entropy_collapse": entropy_falls,
    "truncated": set_(**{"completion/truncated_frac": 0.9, "completion/mean_length": 63.5}),
    "advantage_blowup": set_(
        **{"reward/min": 0.62, "reward/max": 0.71, "advantage/min": -1.3, "advantage/max": 1.47}
    ),
    "lr_too_low": lambda m, s: m.update(
        {"update/rel_change": 2e-6, "reward/mean": 0.45 + 0.01 * math.sin(s)}
    ),
    "judge_unreadable": set_(**{"judge/unreadable_frac": 0.25, "judge/unreadable_example": "#### 7"}),
    # tool episodes (health_tools.py; tests/test_health_tools.py has more)
    "no_tool_calls_parse": set_(
        **{
            "tools/calls_per_episode": 1.5,
            "tools/parse_fail_frac": 1.0,
            "tools/unreadable_example": '<tool_call>{"name": "search"',
        }
    ),
    "stopped_calling_tools": lambda m, s: m.update({"tools/calls_per_episode": 2.0 if s < 40 else 0.0}),
    "answers_without_searching": set_(
        **{
            "tools/calls_per_episode": 0.1,
            "tools/parse_fail_frac": 0.0,
            "tools/answered_without_call_frac": 0.9,
        }
    ),
}


def test_every_rule_has_a_case_and_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "health.md").read_text()
    for rule in RULES:
        assert rule.name in CASES
        assert f"`{rule.name}`" in doc and rule.seed and rule.suggestion


@pytest.mark.parametrize("name", list(CASES))
def test_rule_fires_on_its_stream(name):
    events = run(stream(CASES[name]))
    fired = [e["rule"] for e in events]
    assert name in fired, fired
    event = next(e for e in events if e["rule"] == name)
    assert event["step"] >= 30 and event["evidence"] and event["suggestion"]
    # reported once even though the condition holds to the end
    assert fired.count(name) == 1


@pytest.mark.parametrize("name", list(CASES))
def test_a_stream_triggers_only_what_belongs_to_it(name):
    # A collapse from 0.45 to 0.05 with every group alike is also a falling reward and empty groups.
    expected = {"reward_collapse": {"reward_collapse", "reward_down", "zero_std"}}.get(name, {name})
    assert {e["rule"] for e in run(stream(CASES[name]))} == expected


def test_evidence_is_worked_out():
    events = run(stream(CASES["grad_at_clip"]))
    # 0.8 is exceeded at 9 of 10: steps 30..38 pinned, step 29 not
    assert "on 9 of the last 10 steps" in events[0]["evidence"] and events[0]["step"] == 38
    spike_event = run(stream(spike))[0]
    assert spike_event["step"] == 40 and "54648652" in spike_event["evidence"].replace(",", "")
    blow = next(e for e in run(stream(CASES["advantage_blowup"])) if e["rule"] == "advantage_blowup")
    assert "(16x)" in blow["evidence"]  # 1.47 / (0.71 - 0.62) = 16.3


def test_thresholds_are_configurable():
    assert run(stream(CASES["zero_std"]), zero_std=0.8) == []
    assert run(stream(CASES["truncated"]), truncated_frac=0.95) == []
    assert run(stream(spike), spike_factor=1e9) == []
    assert [e["rule"] for e in run(stream(set_(frac_zero_std=0.45)), zero_std=0.4)] == ["zero_std"]


def kl_events(kls: dict[int, float], replayed: int = 0) -> list[dict]:
    """kl_runaway's events on a run that measured KL at the given steps only (the first `replayed` steps
    caught up on as a resumed run does, reporting nothing)."""
    rows = [{"step": s, "kl": kls.get(s)} for s in range(1, max(kls) + 1)]
    monitor = HealthMonitor(Thresholds(HealthSettings()))  # kl_max 1.0
    monitor.replay(rows[:replayed])
    return [e for m in rows[replayed:] for e in monitor.observe(m) if e["rule"] == "kl_runaway"]


def test_kl_runaway_judges_the_kl_gained_since_a_continued_start():
    # A warm start measures its distance from the base at step 1 (2.09 in a web run): not a runaway.
    assert kl_events({1: 2.09, 10: 2.15, 20: 2.3, 30: 2.5, 40: 2.9}) == []
    assert kl_events({1: 2.09, 10: 2.15, 20: 2.3, 30: 2.5, 40: 2.9}, replayed=25) == []  # resumed: start kept
    [event] = kl_events({1: 2.09, 10: 2.6, 20: 3.3, 30: 3.9})
    assert event["step"] == 20  # 1.21 gained over the start; 2.6 at step 10 was only 0.51
    assert event["evidence"] == (
        "KL to the reference is 3.3 and rising (2.09 at step 1, 2.6 at step 10, "
        "3.3 at step 20), up 1.21 from the 2.09 it started at (step 1)"
    )


def test_kl_runaway_from_the_base_and_on_a_single_value():
    [event] = kl_events({1: 0.0, 10: 1.5})  # from the base step 1 logs 0
    assert event["step"] == 10
    assert event["evidence"] == "KL to the reference is 1.5 and rising (0 at step 1, 1.5 at step 10)"
    assert kl_events({1: 2.09}) == [] and kl_events({10: 5.0}) == []  # one value is no trend


def test_a_rule_rearms_after_a_quiet_window():
    def on_off(m, s):
        if s < 42 or s >= 55:
            m["completion/truncated_frac"] = 1.0

    fired = [e["step"] for e in run(stream(on_off, start=20)) if e["rule"] == "truncated"]
    assert len(fired) == 2 and fired[0] < 42 < 55 <= fired[1]


def test_collapse_at_the_top_is_told_apart():
    solved = run(
        stream(
            set_(
                loss=0.0,
                grad_norm=0.0,
                **{"reward/std": 0.0, "reward/mean": 1.0, "reward/best_of_n": 1.0, "frac_zero_std": 1.0},
            )
        )
    )
    event = next(e for e in solved if e["rule"] == "reward_collapse")
    assert "best reward of the run" in event["evidence"]


def test_a_run_that_never_had_a_signal_is_not_called_solved_nor_told_to_raise_lr():
    """SmolLM2 on multihop: reward 0 in every group from step 1, grad 0, the weights never move."""

    def never(m, s):
        m.update(
            {
                "loss": 0.0,
                "grad_norm": 0.0,
                "reward/std": 0.0,
                "reward/mean": 0.0,
                "reward/best_of_n": 0.0,
                "frac_zero_std": 1.0,
                "update/rel_change": 0.0,
            }
        )

    events = run(stream(never, start=1))
    assert {e["rule"] for e in events} == {"reward_collapse", "zero_std"}  # not lr_too_low
    collapse = next(e for e in events if e["rule"] == "reward_collapse")
    assert "since the run began" in collapse["evidence"] and "solved" not in collapse["evidence"]


def test_fitted_trend_matches_numpy():
    rng = np.random.default_rng(3)
    y = 2.0 - 0.1 * np.arange(20) + rng.normal(0, 0.2, 20)
    slope, t = fitted_trend(list(y))
    (ref_slope, _), cov = np.polyfit(np.arange(20), y, 1, cov="unscaled")
    resid = y - np.polyval(np.polyfit(np.arange(20), y, 1), np.arange(20))
    se = math.sqrt(resid @ resid / 18 * cov[0, 0])
    assert slope == pytest.approx(ref_slope) and t == pytest.approx(ref_slope / se)


def test_relative_change_of_parameter_trees():
    before = {"a": mx.array([3.0, 0.0]), "b": [mx.array([[0.0, 4.0]])]}
    after = {"a": mx.array([3.0, 1.0]), "b": [mx.array([[0.0, 4.0 + 2.0]])]}
    assert relative_change(before, after) == pytest.approx(math.sqrt(1 + 4) / 5)


def test_nonfinite_events_and_stop():
    monitor = HealthMonitor(max_nonfinite=2)
    assert monitor.observe({"step": 1, "update/nonfinite": 1})[0]["rule"] == "nonfinite"
    monitor.observe({"step": 2, "update/nonfinite": 0, "skipped_updates": 1})  # skipped for want of signal
    assert monitor.stop_reason is None  # the streak was broken
    monitor.observe({"step": 3, "update/nonfinite": 1})
    monitor.observe({"step": 4, "update/nonfinite": 1})
    assert monitor.stop_reason.startswith("stopped at step 4")


# ---- the display ----


def test_trend_arrows():
    assert trend([1, 1, 1, 2, 2, 2]) == "↑"
    assert trend([2, 2, 2, 1, 1, 1]) == "↓"
    assert trend([1.0, 1.01, 1.0, 1.01]) == "→"
    assert trend([1.0]) == ""


def test_plain_display_prints_a_health_event_once_and_live_view_renders():
    out = io.StringIO()
    display = TrainDisplay(Console(file=out, width=200), live=False)
    event = {
        "step": 7,
        "rule": "zero_std",
        "title": "most groups carry no signal",
        "evidence": "60% of groups ...",
        "suggestion": "raise temperature",
    }
    display("health", event)
    text = out.getvalue()
    assert text.count("health: step 7: most groups carry no signal: 60% of groups") == 1
    assert "suggestion: raise temperature" in text

    console = Console(file=io.StringIO(), width=120, force_terminal=True, record=True)
    rng = np.random.default_rng(0)
    steps = [{**healthy(s, rng), "reward/mean": 0.1 * s, "grad_norm": 1.0 / s} for s in range(1, 9)]
    steps[3]["kl"] = 0.0123  # measured on step 4 only: the table keeps showing it
    console.print(metrics_table(steps))
    header, values = console.export_text().splitlines()[:2]
    assert header.split()[:3] == ["reward", "best-of-N", "eval"]
    assert values.split()[:8] == ["0.800", "↑", "0.90", "→", "-", "0.0123", "0.125", "↓"]


def test_live_view_goes_through_a_run_without_error():
    from types import SimpleNamespace

    out = io.StringIO()
    display = TrainDisplay(Console(file=out, width=110, force_terminal=True), live=True)
    config = SimpleNamespace(task="arith", model=None, steps=2)
    display("start", {"config": config, "run_dir": "r", "warnings": [], "resumed_from": 0})
    rng = np.random.default_rng(0)
    for step in (1, 2):
        records = [
            {"step": step, "prompt": "Tom has [3] shells", "completion": "3 + 1 = 4\n#### 4", "reward": 1.0},
            {"step": step, "prompt": "Tom has [3] shells", "completion": "no idea", "reward": 0.0},
        ]
        display("step", {"metrics": healthy(step, rng), "records": records, "total": 2})
    display(
        "health",
        {
            "step": 2,
            "rule": "truncated",
            "title": "completions mostly truncated",
            "evidence": "e",
            "suggestion": "s",
        },
    )
    display("eval", {"when": "after", "accuracy": 0.5, "n": 10, "seconds": 0.1})
    display("end", {"result": SimpleNamespace(summary_line=lambda: "done", run_dir="r")})
    text = out.getvalue()
    assert "step 2: best sample, reward 1.000" in text and "#### 4" in text
    assert "Tom has [3] shells" in text  # completions are text, not rich markup
    assert "health: step 2: completions mostly truncated: e" in text and "done" in text
    assert display.live is None


def test_judge_unreadable_counts_from_two_steps_and_stops_at_its_threshold():
    event = next(e for e in run(stream(CASES["judge_unreadable"])) if e["rule"] == "judge_unreadable")
    # logged from step 30 on: at step 31 the mean of two steps, 0.25, is above 0.2
    assert event["step"] == 31
    assert (
        event["evidence"]
        == "25% of the judge's answers over the last 2 steps were not a score; it said '#### 7'"
    )
    assert run(stream(set_(**{"judge/unreadable_frac": 0.15}))) == []  # below the threshold
    assert run(stream(CASES["judge_unreadable"]), judge_unreadable=0.3) == []
