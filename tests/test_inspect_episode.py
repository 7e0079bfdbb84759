"""`mlx-grpo inspect RUN_DIR [--step N --index K]` on multi-turn runs: a recorded tool episode shown turn by
turn, its calls under each turn and every masked span (template headers, tool results) bracketed, from the
mask the loss was given; single-turn records, older episode records and bad choices."""

import json

from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.evaluation.inspect_episode import CLOSE, OPEN, _split, record_lines
from mlx_grpo.files import training_rows
from mlx_grpo.sampling.episode_record import episode_segments
from mlx_grpo.tools import episode as tool_env
from mlx_grpo.tools.calls import ToolCall

RESULT = "Norway's capital is Oslo."


def test_segments_follow_the_mask():
    class Chars:
        def decode(self, ids):
            return "".join(map(chr, ids))

    text = [ord(c) for c in "ab<r>c"]
    mask = [1, 1, 0, 0, 0, 1]
    assert episode_segments(Chars(), text, mask) == [
        {"text": "ab", "trained": True},
        {"text": "<r>", "trained": False},
        {"text": "c", "trained": True},
    ]
    assert episode_segments(Chars(), [], []) == []


def _tool_run(tmp_path, tiny_model_path, monkeypatch):
    """A real one-step --tools run on the tiny model; every turn calls lookup (the random model writes no
    call of its own), so each episode is: turn, tool result, turn (max_turns 2)."""
    monkeypatch.setattr(
        tool_env,
        "parse_calls",
        lambda text, style="hermes": [ToolCall("lookup", {"title": "Norway"}, None, text)],
    )
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"prompt": "Capital of country {i}?", "answer": "Oslo"}}\n' for i in range(8)))
    (tmp_path / "rewards.py").write_text(
        "def exact(prompts, completions, answer, **kw):\n"
        "    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]\n"
    )
    (tmp_path / "tools.py").write_text(
        f"def lookup(title: str) -> str:\n    '''Read a page.'''\n    return {RESULT!r}\n"
    )
    run = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            str(tiny_model_path),
            "--task",
            "custom",
            "--data",
            str(data),
            "--reward-file",
            str(tmp_path / "rewards.py"),
            "--reward",
            "exact",
            "--tools",
            str(tmp_path / "tools.py"),
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--max-turns",
            "2",
            "--max-tokens",
            "6",
            "--eval-num-problems",
            "2",
            "--output",
            str(run),
        ],
    )
    assert result.exit_code == 0, result.output
    return run


def test_inspect_shows_a_tool_episode_with_its_calls_results_and_masked_spans(
    tmp_path, tiny_model_path, monkeypatch
):
    run = _tool_run(tmp_path, tiny_model_path, monkeypatch)
    records = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert len(records) == 4
    record = records[1]
    # what the loss was given: the model's two turns trained, what came between (the result) masked
    assert [s["trained"] for s in record["segments"]] == [True, False, True]
    assert RESULT in record["segments"][1]["text"] and "<tool_response>" in record["segments"][1]["text"]
    assert not any(RESULT in s["text"] for s in record["segments"] if s["trained"])
    ran = {"name": "lookup", "arguments": {"title": "Norway"}, "error": None}
    assert record["turns"] == 2 and record["calls"] == [[ran], [ran]]
    # the step metrics the tool health rules read
    metrics = training_rows([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()])[
        0
    ]
    assert metrics["tools/calls_per_episode"] == 2.0 and metrics["tools/parse_fail_frac"] == 0.0
    assert metrics["tools/answered_without_call_frac"] == 0.0

    result = CliRunner().invoke(app, ["inspect", str(run), "--step", "1", "--index", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "episode: step 1, index 1 of 4 (prompt 0, member 1); --step N --index K shows another"
    assert "legend:" in lines[2] and "health events" not in result.output  # the episode alone
    first, second = lines.index("  turn 1: model (trained)"), lines.index("  turn 2: model (trained)")
    inserted = lines.index("  inserted (masked)")
    turn1 = [f"    {line}" for line in _split(record["segments"][0]["text"])]
    # turn 1's text as the model wrote it (not bracketed), then the call read from it, then the masked result
    assert lines[first + 1 : first + 1 + len(turn1)] == turn1
    assert lines[first + 1 + len(turn1)] == '    -> calls: lookup(title="Norway") ran'
    assert first < inserted < second
    masked = lines[inserted + 1 : second]
    assert masked and all(line.startswith(f"    {OPEN}") and line.endswith(CLOSE) for line in masked)
    assert [line[5:-1] for line in masked] == _split(record["segments"][1]["text"])
    assert f"    {OPEN}{RESULT}{CLOSE}" in masked
    # the tool result is nowhere shown as trained text
    assert all(line.strip().startswith(OPEN) for line in lines if RESULT in line)

    # inspect RUN_DIR alone: the summary, then the last step's first episode
    summary = CliRunner().invoke(app, ["inspect", str(run)]).output
    assert "health events" in summary and "episode: step 1, index 0 of 4" in summary


def _write_records(run, records):
    run.mkdir()
    (run / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_single_turn_records_old_episode_records_and_bad_choices(tmp_path):
    run = tmp_path / "run"
    base = {
        "step": 1,
        "prompt": "2+2?",
        "reward": 1.0,
        "rewards": {"correct": 1.0},
        "advantage": 0.5,
        "length": 3,
    }
    _write_records(
        run,
        [
            {**base, "completion": "4", "finish_reason": "stop"},
            {**base, "completion": "> look\nresult", "finish_reason": "done", "advantage": None},
        ],
    )
    text = "\n".join(record_lines(run, 1, 0))
    assert text.startswith("completion: step 1, index 0 of 2") and "completion (trained)\n    4" in text
    assert "reward 1.000 (correct 1.000), advantage +0.500, ended stop, 3 tokens" in text
    old = "\n".join(record_lines(run, None, 1))  # the last step by default
    assert old.startswith("episode: step 1, index 1 of 2") and "masked spans cannot be marked" in old
    assert "not trained (its group was filtered out)" in old
    runner = CliRunner()
    for args, said in (
        (["--step", "9"], "no records of step 9 (it has steps 1 to 1)"),
        (["--index", "5"], "--index 5: step 1 has 2 completions (0 to 1)"),
    ):
        result = runner.invoke(app, ["inspect", str(run), *args])
        assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output
