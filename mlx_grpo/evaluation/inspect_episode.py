"""`mlx-grpo inspect RUN_DIR --step N --index K`: one recorded completion or episode, turn by turn.

An episode's record (sampling/episode_record.py) holds its text after the prompt
cut where the loss mask changes. The model's own tokens are shown as they are;
every masked run (the template's role headers, observations, tool results: no
gradient) is shown line by line inside ⟦ ⟧, and the CLI dims it. Under each
model turn of a tool episode come the calls its environment read from it.
Reads completions.jsonl and config.yaml only.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from .plot import PlotError

OPEN, CLOSE = "⟦", "⟧"
LEGEND = (
    f"legend: plain text is the model's own tokens (trained); {OPEN}...{CLOSE} is masked, no gradient "
    "(template headers, observations, tool results), a pair of brackets a line"
)
EPISODE_ENDS = ("done", "max_turns", "max_tokens", "env_error")  # single-turn records end "stop" or "length"
CALL_OUTCOMES = {
    None: "ran",
    "parse": "could not be read",
    "invalid": "unknown tool or bad arguments",
    "raised": "the tool raised",
    "timeout": "timed out",
}


def read_step(run_dir: Path, step: int | None) -> tuple[int, list[dict]]:
    """(step, its records in order) from completions.jsonl; the last step when `step` is None."""
    path = run_dir / "completions.jsonl"
    if not path.is_file():
        raise PlotError(f"{run_dir}: no completions.jsonl (no step has finished yet)")
    found, last, steps = [], None, set()
    with open(path, encoding="utf-8") as f:
        for line in f:  # line by line: a long run's file is large, and one step is wanted
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line still being written, or cut by a kill
            s = record.get("step")
            steps.add(s)
            if step is None and s != last:
                found, last = [], s
            if step is None or s == step:
                found.append(record)
    if not found:
        known = sorted(s for s in steps if isinstance(s, int))
        have = f"it has steps {known[0]} to {known[-1]}" if known else "it has none"
        raise PlotError(f"{path}: no records of step {step} ({have})")
    return (last if step is None else step), found


def is_episode(record: dict) -> bool:
    return "segments" in record or record.get("finish_reason") in EPISODE_ENDS


def last_episode_lines(run_dir: str | Path) -> list[str]:
    """The last step's first episode, for inspect's summary of a multi-turn run; [] for other runs."""
    try:
        step, records = read_step(Path(run_dir), None)
    except PlotError:
        return []  # no step recorded yet
    return _lines(Path(run_dir), step, records, 0) if is_episode(records[0]) else []


def record_lines(run_dir: str | Path, step: int | None = None, index: int = 0) -> list[str]:
    """One completion or episode of a run, as lines of text (see the module docstring)."""
    step, records = read_step(Path(run_dir), step)
    return _lines(Path(run_dir), step, records, index)


def _lines(run_dir: Path, step: int, records: list[dict], index: int) -> list[str]:
    if not 0 <= index < len(records):
        raise PlotError(
            f"--index {index}: step {step} has {len(records)} completions (0 to {len(records) - 1})"
        )
    record = records[index]
    group = _group_size(run_dir)
    where = f" (prompt {index // group}, member {index % group})" if group else ""
    kind = "episode" if is_episode(record) else "completion"
    head = [
        f"{kind}: step {step}, index {index} of {len(records)}{where}; --step N --index K shows another",
        f"  {_outcome(record)}",
    ]
    prompt = ["  prompt (context, not trained)", *_indent(str(record.get("prompt", "")))]
    completion = _indent(str(record.get("completion", "")))
    if "segments" in record:
        return head + [f"  {LEGEND}"] + prompt + _episode_lines(record)
    if kind == "episode":  # recorded before completions.jsonl kept the mask
        return (
            head
            + prompt
            + ["  transcript (recorded without its mask: the masked spans cannot be marked)", *completion]
        )
    return head + prompt + ["  completion (trained)", *completion]


def _group_size(run_dir: Path) -> int | None:
    path = run_dir / "config.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    return (config or {}).get("group_size")


def _outcome(record: dict) -> str:
    parts = ", ".join(f"{k} {_num(v)}" for k, v in (record.get("rewards") or {}).items())
    advantage = record.get("advantage")
    trained = (
        f"advantage {advantage:+.3f}" if advantage is not None else "not trained (its group was filtered out)"
    )
    turns = f" after {record['turns']} turn(s)" if "turns" in record else ""
    return (
        f"reward {_num(record.get('reward'))}"
        + (f" ({parts})" if parts else "")
        + f", {trained}, ended {record.get('finish_reason')}{turns}, {record.get('length')} tokens"
    )


def _episode_lines(record: dict) -> list[str]:
    calls = record.get("calls")  # one list a turn the environment read; None: not a tool episode
    lines, turn = [], 0
    for segment in record["segments"]:
        if not segment["trained"]:
            lines.append("  inserted (masked)")
            lines += [f"    {OPEN}{line}{CLOSE}" for line in _split(segment["text"])]
            continue
        turn += 1
        lines.append(f"  turn {turn}: model (trained)")
        lines += _indent(segment["text"])
        if calls is not None:
            lines.append(f"    -> {_calls_text(calls, turn - 1, record.get('finish_reason'))}")
    return lines


def _calls_text(calls: list, k: int, finish: str | None) -> str:
    if k >= len(calls):
        return "calls: not read (the episode ended during this turn)"
    if not calls[k]:
        return "calls: none, so this turn is the answer" if finish == "done" else "calls: none"
    return "calls: " + "; ".join(_call_text(c) for c in calls[k])


def _call_text(call: dict) -> str:
    if call.get("name") is None:
        return f"an unreadable call ({CALL_OUTCOMES['parse']})"
    arguments = ", ".join(
        f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in (call.get("arguments") or {}).items()
    )
    return f"{call['name']}({arguments}) {CALL_OUTCOMES.get(call.get('error'), call.get('error'))}"


def _split(text: str) -> list[str]:
    """The lines of a text; a final newline ends the last line rather than starting an empty one."""
    return (text[:-1] if text.endswith("\n") else text).split("\n")


def _indent(text: str) -> list[str]:
    return [f"    {line}" for line in _split(text)]


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"
