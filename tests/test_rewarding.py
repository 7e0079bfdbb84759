"""Reward functions that raise, hang, return NaN, non-numbers or the wrong
length cost only the examples they fail on; one that fails on every example
stops the run with a clear message."""

import math
import threading

import numpy as np
import pytest
from mlx_grpo.tasks.rewarding import RewardError, score_completions, with_timeout

PROMPTS = ["p0", "p1", "p2", "p3"]
COMPLETIONS = ["a", "bb", "bad", "dddd"]
COLUMNS = {"answer": ["1", "2", "3", "4"]}


def length(prompts, completions, **kw):
    return [float(len(c)) for c in completions]


def score(*functions, weights=None, completions=COMPLETIONS):
    return score_completions(
        list(functions), weights or [1.0] * len(functions), PROMPTS, completions, COLUMNS
    )


def test_a_raise_on_one_example_costs_only_that_example():
    def picky(prompts, completions, answer):
        if "bad" in completions:
            raise KeyError("no rule for 'bad'")
        return [float(a) for a in answer]

    s = score(picky, length, weights=[10.0, 1.0])
    assert s.parts["picky"] == [1.0, 2.0, None, 4.0]  # each example alone: only 'bad' fails
    assert s.errors == {"picky": 1}
    assert s.error_examples["picky"] == "KeyError: \"no rule for 'bad'\" (prompt 'p2', completion 'bad')"
    np.testing.assert_allclose(
        s.total, [11.0, 22.0, 3.0, 44.0]
    )  # the failed part is left out, not zero-weighted


@pytest.mark.parametrize(
    "bad_value, reason",
    [
        (float("nan"), "returned nan"),
        (math.inf, "returned inf"),
        ("high", "returned a non-number 'high'"),
        (True, "returned a non-number True"),
        ([1.0], "returned a non-number [1.0]"),
    ],
)
def test_bad_values_are_counted_per_example(bad_value, reason):
    def odd(prompts, completions):
        return [bad_value if c == "bad" else 0.5 for c in completions]

    s = score(odd)
    assert s.parts["odd"] == [0.5, 0.5, None, 0.5]
    assert s.errors == {"odd": 1}
    assert s.error_examples["odd"].startswith(reason)
    assert "completion 'bad'" in s.error_examples["odd"]


def test_none_is_not_applicable_not_a_failure():
    s = score(lambda prompts, completions: [None, 1.0, None, 2.0])
    assert s.parts["<lambda>"] == [None, 1.0, None, 2.0] and s.errors == {}
    np.testing.assert_allclose(s.total, [0.0, 1.0, 0.0, 2.0])


def test_wrong_length_falls_back_to_one_call_per_example():
    calls = []

    def drops_last(prompts, completions):
        calls.append(len(completions))
        return [1.0] * (len(completions) - 1) if len(completions) > 1 else [2.0]

    s = score(drops_last)
    assert calls == [4, 1, 1, 1, 1]
    assert s.parts["drops_last"] == [2.0] * 4
    assert s.errors == {"drops_last": 0}  # nothing lost, but the failed batch call is noted
    assert s.error_examples["drops_last"] == (
        "the call on all 4 failed (ValueError: returned 3 values for 4 "
        "completions); each example was then scored alone"
    )


def test_a_reward_failing_on_every_example_stops_the_run():
    def broken(prompts, completions):
        return undefined_name  # noqa: F821

    with pytest.raises(RewardError, match=r"reward 'broken' failed on all 4 completions, e.g. NameError"):
        score(length, broken)

    def always_two(prompts, completions):
        return [1.0, 2.0]

    with pytest.raises(RewardError, match="returned 2 values for 1 completions"):
        score(always_two)


def test_system_exit_inside_a_reward_does_not_end_training():
    def quits(prompts, completions):
        if "bad" in completions:
            raise SystemExit(3)
        return [1.0] * len(completions)

    s = score(quits)
    assert s.errors == {"quits": 1} and s.parts["quits"][2] is None


def test_a_hang_on_one_example_times_out_and_the_rest_are_scored():
    release = threading.Event()

    def hangs_on_bad(prompts, completions, answer):
        if "bad" in completions:
            release.wait(60)  # hangs until the test ends
        return [float(a) for a in answer]

    timed = with_timeout(hangs_on_bad, 0.2)
    assert timed.__name__ == "hangs_on_bad"
    try:
        s = score(timed)
    finally:
        release.set()  # let the abandoned threads finish
    assert s.parts["hangs_on_bad"] == [1.0, 2.0, None, 4.0]  # columns still reach the wrapped function
    assert s.errors == {"hangs_on_bad": 1}
    assert s.error_examples["hangs_on_bad"].startswith("RewardTimeout: timed out after 0.2s")
    assert "completion 'bad'" in s.error_examples["hangs_on_bad"]


def test_a_reward_that_always_hangs_is_given_up_on():
    release = threading.Event()
    calls = []

    def stuck(prompts, completions):
        calls.append(len(completions))
        release.wait(60)
        return [0.0] * len(completions)

    try:
        with pytest.raises(RewardError, match="failed on all 4 completions, e.g. RewardTimeout"):
            score(with_timeout(stuck, 0.1))
    finally:
        release.set()
    assert calls == [4, 1, 1]  # the batch, then two single examples; the rest are not tried


def test_with_timeout_passes_results_and_errors_through():
    assert with_timeout(length, None) is length
    assert with_timeout(length, 5)(["p"], ["abc"]) == [3.0]

    def raises(prompts, completions):
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        with_timeout(raises, 5)(["p"], ["c"])
