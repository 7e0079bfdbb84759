"""The tool-run health rules (run/health_tools.py) on crafted metric streams, the step metrics they read
(tools/episode.py tool_metrics) from real tool episodes, and silence on runs without tool episodes."""

import numpy as np
import pytest

from mlx_grpo.run.health import HealthMonitor, Thresholds
from mlx_grpo.run.health_tools import TOOL_RULES
from mlx_grpo.sampling.multiturn import Episode, episode_metrics
from mlx_grpo.setting_groups import HealthSettings
from mlx_grpo.tools import episode as tool_env

TOOL_RULE_NAMES = {rule[0] for rule in TOOL_RULES}


def tool_steps(n, calls, parse_fail=0.05, closed_book=0.1, seed=0, **extra):
    """n steps of a tool run; calls, parse_fail and closed_book are numbers or functions of the step."""
    rng = np.random.default_rng(seed)

    def value(v, s):
        return v(s) if callable(v) else v

    rows = []
    for s in range(1, n + 1):
        c = value(calls, s)
        c = max(0.0, c + float(rng.normal(0, 0.05))) if c else 0.0  # a step without calls logs 0 exactly
        rows.append(
            {
                "step": s,
                "reward/mean": 0.3 + 0.002 * s,
                "reward/std": 0.4,
                "tools/calls_per_episode": c,
                "tools/parse_fail_frac": value(parse_fail, s) if c else None,
                "tools/answered_without_call_frac": value(closed_book, s),
                **extra,
            }
        )
    return rows


def fired(rows, window=10, **thresholds) -> dict[str, dict]:
    monitor = HealthMonitor(Thresholds(HealthSettings(window=window, **thresholds)))
    return {e["rule"]: e for row in rows for e in monitor.observe(row)}


@pytest.mark.parametrize("calls", [1.8, lambda s: 3.0 - 0.03 * s, lambda s: 0.8 + 0.02 * s])
def test_a_healthy_tool_run_fires_none(calls):
    """Steady calls, calls getting fewer as the model learns to need fewer (3 -> 1.2), calls rising."""
    assert not TOOL_RULE_NAMES & set(fired(tool_steps(60, calls)))


def test_unreadable_calls_fire_after_half_a_window_with_an_example():
    example = '<tool_call>{"name": "search", "arguments": {"query": "Kalo"</tool_call>'
    rows = tool_steps(12, 1.5, parse_fail=1.0, closed_book=0.0, **{"tools/unreadable_example": example})
    event = fired(rows)["no_tool_calls_parse"]
    assert event["step"] == 5  # half the window of 10
    assert (
        "100% of the tool calls the model wrote over the last 5 steps could not be read" in event["evidence"]
    )
    assert repr(example[:120]) in event["evidence"] and "--tool-style" in event["suggestion"]
    # some calls read (20%): the model can write them; nothing fires
    assert "no_tool_calls_parse" not in fired(tool_steps(30, 1.5, parse_fail=0.8, closed_book=0.0))
    # calls written on fewer than half the steps: too little to go on
    sparse = tool_steps(30, lambda s: 1.0 if s % 3 == 0 else 0.0, parse_fail=1.0, closed_book=0.0)
    assert "no_tool_calls_parse" not in fired(sparse)
    assert "no_tool_calls_parse" not in fired(rows, tool_parse_fail=1.0)  # the threshold can switch it off


def test_a_model_that_stopped_calling_fires_once_with_the_fall():
    rows = tool_steps(40, lambda s: 2.0 if s <= 15 else 0.0, closed_book=lambda s: 0.05 if s <= 15 else 0.95)
    events = fired(rows)
    assert "stopped_calling_tools" in events
    evidence = events["stopped_calling_tools"]["evidence"]
    assert (
        evidence.startswith("tool calls per episode fell from 2 (steps ")
        and "over the last 10 steps" in evidence
    )
    assert "reward/mean" in evidence
    # from a level that never meant much (0.3 calls an episode), or down by half: quiet
    assert "stopped_calling_tools" not in fired(tool_steps(40, lambda s: 0.3 if s <= 15 else 0.0))
    assert "stopped_calling_tools" not in fired(tool_steps(40, lambda s: 2.0 if s <= 15 else 1.0))


def test_closed_book_answers_fire_naming_the_share():
    rows = tool_steps(20, 0.2, closed_book=0.8, **{"tools/support_recall": 0.1})
    event = fired(rows)["answers_without_searching"]
    assert event["step"] == 10 and event["evidence"].startswith(
        "80% of episodes over the last 10 steps answered"
    )
    assert "supporting-paragraph recall 0.10" in event["evidence"] and "support_reward" in event["suggestion"]
    assert "never" not in event["evidence"]
    never = fired(tool_steps(20, 0.0, closed_book=1.0))["answers_without_searching"]["evidence"]
    assert "no episode has called a tool since the run began" in never
    assert "answers_without_searching" not in fired(tool_steps(40, 1.2, closed_book=0.4))
    assert "answers_without_searching" not in fired(rows, closed_book=0.9)


def test_unreadable_calls_are_not_also_reported_as_closed_book():
    """Calls in another style end the episode as an answer without a call: the parse rule alone says why."""
    rows = tool_steps(20, 1.0, parse_fail=1.0, closed_book=1.0)
    assert {"no_tool_calls_parse"} == TOOL_RULE_NAMES & set(fired(rows))


def test_runs_without_tool_episodes_never_fire_them():
    """arith/gsm8k log no episode metrics; web episodes log episode/ metrics but no tools/ ones."""
    web = [
        Episode(
            0,
            [1],
            tokens=[5, 6, 7],
            mask=[1, 0, 1],
            turns=["a", "b"],
            finish_reason="done",
            info={"valid": True, "error": None, "step": 2, "solved": s % 2 == 0},
        )
        for s in range(8)
    ]
    metrics = episode_metrics(web)
    assert not any(key.startswith("tools/") for key in metrics)
    assert tool_env.tool_metrics([{}, {"valid": False}]) == {}
    rng = np.random.default_rng(0)
    # extremes of everything else the trainer logs: still nothing for these rules to read
    rows = [
        {
            "step": s,
            "reward/mean": float(rng.random()),
            "reward/std": 0.0,
            "frac_zero_std": 1.0,
            "completion/mean_length": 1.0,
            "completion/truncated_frac": 1.0,
            **metrics,
        }
        for s in range(1, 61)
    ]
    assert not TOOL_RULE_NAMES & set(fired(rows, window=4))


def lookup(title: str) -> str:
    """Read a page.

    Args:
        title: the page's title
    """
    return "Norway's capital is Oslo."


def exact(prompts, completions, answer, **kw):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def test_tool_metrics_of_real_episodes_by_hand(tiny_model_path):
    """Three episodes of the hermes style: calls read and not, a llama3-style call, a closed-book answer."""
    from mlx_grpo.models.loading import load_policy

    _, tokenizer = load_policy(str(tiny_model_path))
    row = {"prompt": "What is the capital of Norway?", "answer": "Oslo"}
    envs = [tool_env.ToolEnv(row, {"lookup": lookup}, tokenizer, [exact]) for _ in range(3)]
    infos = []
    good = '<tool_call>{"name": "lookup", "arguments": {"title": "Norway"}}</tool_call>'
    broken = '<tool_call>{"name": "lookup", "arguments": </tool_call>'
    for env, turns in zip(
        envs,
        [
            [good + broken, "Oslo"],
            ['{"name": "lookup", "parameters": {"title": "Norway"}}'],
            ["Oslo, I think"],
        ],
    ):
        env.reset()
        for turn in turns:
            _, done, info = env.step(turn)
        assert done
        infos.append(info)
    assert infos[0]["calls"] == [
        [
            {"name": "lookup", "arguments": {"title": "Norway"}, "error": None},
            {"name": None, "arguments": {}, "error": "parse"},
        ],
        [],
    ]
    assert infos[1]["tools/misstyled"] == 1 and infos[1]["tools/calls"] == 0
    metrics = tool_env.tool_metrics(infos + [{}])  # the fourth was cut before its first turn was read
    assert metrics["tools/calls_per_episode"] == pytest.approx(3 / 4)  # 2 written in hermes, 1 in llama3
    assert metrics["tools/parse_fail_frac"] == pytest.approx(2 / 3) and metrics["tools/error_frac"] == 0.0
    assert metrics["tools/answered_without_call_frac"] == pytest.approx(2 / 4)  # the llama3 one and the guess
    assert metrics["tools/unreadable_example"] == broken


def test_the_suggested_tool_style_setting_reaches_the_episodes(tmp_path):
    """no_tool_calls_parse suggests --tool-style: it is checked, and --tools and multihop episodes read with
    it."""
    from mlx_grpo.config import ConfigError, build_config
    from mlx_grpo.config_checks import TOOL_STYLES
    from mlx_grpo.run.task_setup import load_task
    from mlx_grpo.tasks.registry import recommended_settings
    from mlx_grpo.tools.calls import STYLES

    assert TOOL_STYLES == STYLES  # config_checks.py sits below tools/, so it repeats the names
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "Capital of Norway?", "answer": "Oslo"}\n' * 4)
    (tmp_path / "rewards.py").write_text(
        "def exact(prompts, completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    (tmp_path / "tools.py").write_text(
        "def lookup(title: str) -> str:\n    '''Read a page.'''\n    return 'Oslo'\n"
    )
    custom = {
        "task": "custom",
        "data": str(data),
        "reward_file": str(tmp_path / "rewards.py"),
        "reward": ["exact"],
        "tools": str(tmp_path / "tools.py"),
    }
    task = load_task(build_config({**custom, "tool_style": "llama3"}))
    assert task.make_env(task.train_rows[0]).chosen_style == "llama3"
    plain = load_task(build_config(custom))
    assert plain.make_env(plain.train_rows[0]).chosen_style is None  # the chat template decides
    multihop = load_task(
        build_config(
            {"task": "multihop", "tool_style": "mistral", "eval_num_problems": 2},
            task_defaults=recommended_settings,
        )
    )
    assert multihop.make_env(multihop.eval_rows[0]).chosen_style == "mistral"
    with pytest.raises(ConfigError, match="tool_style must be one of hermes, llama3, mistral; got 'json'"):
        build_config({**custom, "tool_style": "json"})
