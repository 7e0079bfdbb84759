"""UED curriculum: favours groups solved about half the time, explores, is seeded, and round-trips its
state."""

import numpy as np
import pytest
from mlx_grpo.tasks.curriculum import Curriculum, group_success
from mlx_grpo.tasks.rewarding import score_completions

from mlx_grpo.config import build_config
from mlx_grpo.sampling.rollout import Completion


def rows():
    return [{"prompt": f"q{i}", "kind": k} for i, k in enumerate(["easy"] * 5 + ["half"] * 5 + ["hard"] * 5)]


def test_probabilities_are_hand_worked():
    c = Curriculum("kind", explore=0.2)
    c.estimates = {"easy": 0.9, "half": 0.5, "hard": 0.0}
    # w = p(1-p) = 0.09, 0.25, 0 -> (0.8 * w / 0.34) + 0.2 / 3
    expected = 0.8 * np.array([0.09, 0.25, 0.0]) / 0.34 + 0.2 / 3
    np.testing.assert_allclose(c.probabilities(["easy", "half", "hard"]), expected)
    assert c.probabilities(["easy", "half", "hard"]).sum() == pytest.approx(1.0)
    # all groups always or never solved: uniform
    c.estimates = {"easy": 1.0, "hard": 0.0}
    np.testing.assert_allclose(c.probabilities(["easy", "hard"]), [0.5, 0.5])


def test_update_is_a_moving_average_from_the_prior():
    c = Curriculum("kind", rate=0.5)
    c.update([{"kind": "a"}, {"kind": "a"}, {"kind": "b"}], [1.0, 1.0, 0.0])
    assert c.estimates == {"a": 0.875, "b": 0.25}  # a: 0.5 -> 0.75 -> 0.875; b: 0.5 -> 0.25
    assert c.counts == {"a": 2, "b": 1}


def test_sampling_favours_half_solved_groups_and_still_explores():
    data = rows()
    c = Curriculum("kind", explore=0.2)
    c.estimates = {"easy": 0.95, "half": 0.5, "hard": 0.02}
    picked = [r["kind"] for step in range(1, 201) for r in c.pick(data, step, 8, seed=0)]
    share = {k: picked.count(k) / len(picked) for k in ("easy", "half", "hard")}
    assert share["half"] > 0.6 and share["easy"] > 0.05 and share["hard"] > 0.05, share
    # rows within a group are drawn uniformly: every "half" prompt appears
    assert {
        r["prompt"] for step in range(1, 50) for r in c.pick(data, step, 8, 0) if r["kind"] == "half"
    } == {f"q{i}" for i in range(5, 10)}


def test_draws_are_seeded_and_state_round_trips():
    data = rows()
    a = Curriculum("kind")
    a.update(data[:3], [1.0, 0.0, 1.0])
    b = Curriculum("kind")
    b.load_state_dict(a.state_dict())
    assert b.estimates == a.estimates and b.counts == a.counts
    assert a.pick(data, 7, 8, seed=3) == b.pick(data, 7, 8, seed=3)
    assert a.pick(data, 7, 8, seed=3) != a.pick(data, 8, 8, seed=3)


def test_rows_without_the_key_are_their_own_group_and_metrics_show_the_distribution():
    c = Curriculum("kind")
    data = [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c", "kind": "x"}]
    m = c.metrics(data)
    assert m["curriculum/groups"] == 3 and m["curriculum/groups_seen"] == 0
    assert m["curriculum/entropy"] == pytest.approx(1.0)
    assert sum(v for k, v in m.items() if k.startswith("curriculum/prob/")) == pytest.approx(1.0)
    assert "curriculum/prob/x" in m and "curriculum/prob/prompt:a" in m


def test_group_success_from_the_accuracy_reward_and_from_episodes():
    def right(prompts, completions, answer, **kw):
        return [float(c == a) for c, a in zip(completions, answer)]

    class Task:
        accuracy_reward = right
        reward_functions = [right]

    data = [{"prompt": "p", "answer": "4"}, {"prompt": "q", "answer": "5"}]
    texts = ["4", "3", "4", "4", "1", "5", "2", "2"]
    completions = [Completion(i // 4, [], [], [], "stop", t) for i, t in enumerate(texts)]
    scores = score_completions(
        [right], [1.0], ["p"] * 4 + ["q"] * 4, texts, {"answer": ["4"] * 4 + ["5"] * 4}
    )
    assert group_success(Task, data, completions, scores, 4) == [0.75, 0.25]

    class Episode:
        def __init__(self, solved):
            self.info, self.reward, self.error = {"solved": solved}, 0.0, ""

    assert group_success(Task, data, [Episode(s) for s in (1, 0, 0, 0, 1, 1, 1, 1)], scores, 4) == [0.25, 1.0]


def test_config_switches_it_on_and_checks_its_settings():
    from mlx_grpo.config import ConfigError

    assert Curriculum.from_config(build_config({})) is None
    c = Curriculum.from_config(
        build_config({"curriculum": "ued", "curriculum_key": "template", "curriculum_explore": 0.5})
    )
    assert (c.key, c.explore) == ("template", 0.5)
    with pytest.raises(ConfigError, match="curriculum must be"):
        build_config({"curriculum": "sometimes"})
    with pytest.raises(ConfigError, match="curriculum_explore"):
        build_config({"curriculum_explore": 1.5})


def arith_rows(n=10):
    return [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]


def test_a_task_without_groups_is_drawn_by_each_prompts_pass_rate():
    """arith-like rows (no kind column): each prompt is a group; draws follow the measured pass rates."""
    data = arith_rows()
    c = Curriculum("kind", explore=0.2)
    names = sorted(c.group_of(r) for r in data)
    assert names[0].startswith("prompt:") and len(set(names)) == 10
    np.testing.assert_allclose(c.probabilities(names), np.full(10, 0.1))  # nothing seen: uniform

    def share(step0):
        picked = [r["prompt"] for step in range(step0, step0 + 150) for r in c.pick(data, step, 8, seed=0)]
        return {p: picked.count(p) / len(picked) for p in {r["prompt"] for r in data}}

    # prompts 0-4 never solved, 5 solved in half its samples, 6-9 not seen yet
    for _ in range(8):
        c.update(data[:6], [0.0] * 5 + [0.5])
    p_unseen = 8 * 0.5 / 48  # the mean success folded in so far: 8 x 0.5 over 48 observations
    assert c.estimate(c.group_of(data[9])) == pytest.approx(p_unseen)
    est = np.array([c.estimate(c.group_of(r)) for r in data])
    w = est * (1 - est)
    np.testing.assert_allclose(c.probabilities([c.group_of(r) for r in data]), 0.8 * w / w.sum() + 0.02)
    before = share(1)
    others = [before[f"What is {i} + 1?"] for i in range(10) if i != 5]
    assert before["What is 5 + 1?"] > 2 * max(others)  # the half-solved prompt is drawn most
    assert max(before[f"What is {i} + 1?"] for i in range(5)) < min(
        before[f"What is {i} + 1?"] for i in range(6, 10)
    )
    # prompt 5 is learned (always solved now): its draws fall below every unseen prompt's
    for _ in range(10):
        c.update([data[5]], [1.0])
    after = share(1000)
    assert after["What is 5 + 1?"] < min(after[f"What is {i} + 1?"] for i in range(6, 10)), after
    assert after["What is 5 + 1?"] < before["What is 5 + 1?"] / 5


def test_curriculum_key_prompt_groups_by_prompt_even_where_a_column_exists():
    c = Curriculum("prompt")
    data = rows()
    assert len({c.group_of(r) for r in data}) == 15
    c.update(data[:1], [1.0])
    b = Curriculum("prompt")
    b.load_state_dict(c.state_dict())
    assert b.observed == c.observed == [1.0, 1]
    assert b.estimate(b.group_of(data[3])) == 1.0  # an unseen prompt: the mean observed
    assert Curriculum("kind").estimate("fact/1") == 0.5  # a named group keeps the optimistic prior
