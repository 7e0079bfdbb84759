"""tasks/accuracy.py, the one judge of right answers: its threshold, the solved test, the reuse of
scores, and that no other module of the package writes them again."""

import ast
from pathlib import Path
from types import SimpleNamespace


from mlx_grpo.tasks.accuracy import RIGHT, accuracy_of, accuracy_values, right, solved
from mlx_grpo.tasks.rewarding import score_completions
from mlx_grpo.tasks.registry import Task

PACKAGE = Path(__file__).resolve().parent.parent / "mlx_grpo"


def test_right_is_at_the_threshold_and_none_is_wrong():
    assert RIGHT == 0.5
    assert right([0.49, 0.5, 1.0, None, 0.0]).tolist() == [False, True, True, False, False]
    assert accuracy_of([0.25, None, 1.0]).tolist() == [0.25, 0.0, 1.0]


def test_solved_reads_the_environment_then_the_reward_and_never_a_failure():
    def ep(reward, info=None, error=None):
        return SimpleNamespace(reward=reward, info=info or {}, error=error)

    assert solved(ep(1.0)) and not solved(ep(0.9))
    assert solved(ep(0.0, {"solved": True})) and not solved(ep(1.0, {"solved": False}))
    assert not solved(ep(1.0, {"solved": True}, error="ValueError: boom"))


def _task(calls, among_rewards):
    def exact(prompts, completions, answer, **kwargs):
        calls.append(len(completions))
        return [1.0 if c.strip() == a else (None if c == "?" else 0.0) for c, a in zip(completions, answer)]

    def short(prompts, completions, **kwargs):
        return [0.1 * (len(c) < 3) for c in completions]

    rewards = [exact, short] if among_rewards else [short]
    return Task("t", [], [], rewards, [1.0] * len(rewards), None, exact, [])


def test_accuracy_values_reuse_the_task_scores_or_score_alone():
    rows = [{"prompt": "p", "answer": "4"}, {"prompt": "q", "answer": "9"}]
    answers = [SimpleNamespace(text=t, finish_reason="stop") for t in ["4", "5", "?", " 9"]]
    calls = []
    task = _task(calls, among_rewards=True)
    scores = score_completions(
        task.reward_functions,
        task.reward_weights,
        ["p", "p", "q", "q"],
        [a.text for a in answers],
        {"answer": ["4", "4", "9", "9"]},
    )
    assert calls == [4]
    assert accuracy_values(task, rows, 2, answers, scores) == [1.0, 0.0, None, 1.0]
    assert calls == [4]  # taken from the scores, not run again
    alone = []
    task = _task(alone, among_rewards=False)
    assert accuracy_values(task, rows, 2, answers, scores) == [1.0, 0.0, None, 1.0]
    assert alone == [4]
    assert right(accuracy_values(task, rows, 2, answers)).tolist() == [True, False, False, True]


def _literal_thresholds(tree) -> list[int]:
    """Lines comparing against the literal 0.5, or reading an episode's info["solved"] with a default."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
            isinstance(c, ast.Constant) and c.value == 0.5 for c in node.comparators
        ):
            found.append(node.lineno)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "solved"
            and len(node.args) == 2
        ):
            found.append(node.lineno)
    return found


def test_the_threshold_and_the_solved_test_are_written_once():
    planted = ast.parse("ok = (v or 0.0) >= 0.5\ns = ep.info.get('solved', ep.reward >= 1.0)\n")
    assert _literal_thresholds(planted) == [1, 2]
    copies = {
        str(p.relative_to(PACKAGE)): lines
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "accuracy.py" and (lines := _literal_thresholds(ast.parse(p.read_text())))
    }
    assert copies == {}
