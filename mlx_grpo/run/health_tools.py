"""Health rules for tool-calling runs (health.py registers them).

They read the step metrics of tool episodes (tools/episode.py `tool_metrics`, logged
by the trainer through multiturn.episode_metrics):

- tools/calls_per_episode: calls the model wrote per episode, read or not;
- tools/parse_fail_frac: the share of those that could not be read (malformed, or
  written in another template's style), None on a step without any;
- tools/answered_without_call_frac: the share of episodes that answered without any call;
- tools/unreadable_example: the text of one call that could not be read.

A run without tool episodes (arith, gsm8k, web) logs none of these, so the rules
never fire there. Seed 004 saw single-step GSM8K learn where multi-step tool tasks
(MuSiQue) did not, with nothing logged about what the episodes did with their
tools; these rules name three ways a tool run goes nowhere that the reward curve
alone does not show.
"""

from __future__ import annotations

import numpy as np

MIN_CALLS = 0.5  # stopped_calling_tools: calls per episode that show the model was using its tools


def no_tool_calls_parse(h) -> str | None:
    """Over half a window (at least 3 steps), nearly every attempted call could not be read."""
    n = max(3, h.t.health.window // 2)
    rows = [r for r in h.steps[-n:] if r.get("tools/calls_per_episode") is not None]
    attempted = [
        r for r in rows if r.get("tools/parse_fail_frac") is not None and r["tools/calls_per_episode"] > 0
    ]
    if len(rows) < n or len(attempted) < (n + 1) // 2:  # calls written on at least half the steps
        return None
    calls = sum(r["tools/calls_per_episode"] for r in attempted)
    unreadable = sum(r["tools/parse_fail_frac"] * r["tools/calls_per_episode"] for r in attempted) / calls
    if unreadable <= h.t.health.tool_parse_fail:
        return None
    example = next(
        (r["tools/unreadable_example"] for r in reversed(rows) if r.get("tools/unreadable_example")), None
    )
    said = f"; e.g. {example[:120]!r}" if example else ""
    return (
        f"{unreadable:.0%} of the tool calls the model wrote over the last {n} steps could not be read "
        f"({calls / len(attempted):.2g} calls per episode, nearly none of them run){said}"
    )


def stopped_calling_tools(h) -> str | None:
    """Calls per episode over the last window fell below `tool_call_drop` of their best earlier window."""
    w = h.t.health.window
    measured = h.last_measured("tools/calls_per_episode", len(h.steps))
    if len(measured) < 2 * w:
        return None
    steps, calls = [s for s, _ in measured], np.array([c for _, c in measured])
    earlier = np.convolve(calls[:-w], np.ones(w) / w, mode="valid")  # every whole window before the last
    best = int(np.argmax(earlier))
    peak, recent = float(earlier[best]), float(calls[-w:].mean())
    if peak < MIN_CALLS or recent >= h.t.health.tool_call_drop * peak:
        return None
    rewards = h.values("reward/mean")
    trend = (
        f"; reward/mean {np.mean(rewards[:w]):.3g} -> {np.mean(rewards[-w:]):.3g}"
        if len(rewards) >= 2 * w
        else ""
    )
    return (
        f"tool calls per episode fell from {peak:.2g} (steps {steps[best]}-{steps[best + w - 1]}) to "
        f"{recent:.2g} over the last {w} steps{trend}"
    )


def answers_without_searching(h) -> str | None:
    """Over a window, more than `closed_book` of the episodes answered without calling any tool."""
    w = h.t.health.window
    shares = h.values("tools/answered_without_call_frac", w)
    if len(shares) < w or np.mean(shares) <= h.t.health.closed_book:
        return None
    if no_tool_calls_parse(h):
        return None  # the model does write calls, in a form the parser cannot read: that rule says so
    calls = h.values("tools/calls_per_episode")
    never = "; no episode has called a tool since the run began" if not any(calls) else ""
    recall = h.values("tools/support_recall", w)
    context = [f"reward/mean {np.mean(r):.3g}" for r in [h.values("reward/mean", w)] if r]
    context += [f"supporting-paragraph recall {np.mean(recall):.2f}"] if recall else []
    said = f" ({', '.join(context)})" if context else ""
    return (
        f"{np.mean(shares):.0%} of episodes over the last {w} steps answered without calling any tool{said}"
        f"{never}"
    )


# Registered by health.py (a Rule each: name, title, check, suggestion, setting, seed evidence).
TOOL_RULES = (
    (
        "no_tool_calls_parse",
        "the model's tool calls cannot be read",
        no_tool_calls_parse,
        "the calls are written in a form the parser does not read: compare one with the call format in "
        "prompt.txt; "
        "set --tool-style (hermes, llama3 or mistral) to the style the model writes, or state the format in "
        "the "
        "system prompt (--system-prompt)",
        "health_tool_parse_fail",
        "seed 004: Qwen2.5-7B on MuSiQue with vLLM's hermes call parser did not learn where GSM8K did, and "
        "its "
        "diagnostics were left blank: nothing showed whether the calls were read",
    ),
    (
        "stopped_calling_tools",
        "the model stopped calling tools",
        stopped_calling_tools,
        "the policy learned to answer without looking anything up: read the latest episodes (mlx-grpo "
        "inspect "
        "RUN_DIR --step N), reward what a lookup brings (multihop: support_reward, e.g. --reward-weights "
        "1,0,0.2), "
        "lower lr, or resume from a checkpoint before the fall",
        "health_tool_call_drop",
        "seed 004: 'single-step (GSM8K) works, multi-step tool-based (MuSiQue) doesn't', with no record of "
        "what "
        "the episodes did with their tools",
    ),
    (
        "answers_without_searching",
        "most answers come without any tool call",
        answers_without_searching,
        "answers without a lookup are guesses or memorised: check in completions.jsonl (mlx-grpo inspect "
        "RUN_DIR "
        "--step N) whether the questions can be answered closed-book, turn on the retrieval-recall reward "
        "(multihop: support_reward, e.g. --reward-weights 1,0,0.2); if no episode ever calls, check that "
        "prompt.txt shows the tools and how to call them",
        "health_closed_book",
        "seed 004: MuSiQue with tools did not learn; exact match pays a closed-book guess as much as a "
        "looked-up "
        "answer, and MuSiQue is built so that guessing rarely works",
    ),
)
