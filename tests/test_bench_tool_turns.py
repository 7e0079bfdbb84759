"""scripts/bench_tool_turns.py on the tiny random model: multi-turn tool episodes and single-turn
completions decode the same rows, and the JSON's counts and rates agree with each other."""

import importlib.util
import json
from pathlib import Path


def _script():
    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_tool_turns.py"
    spec = importlib.util.spec_from_file_location("bench_tool_turns", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_tool_turns_bench_reports_both_modes_at_the_same_shape(tiny_model_path, tmp_path, capsys):
    out_file = tmp_path / "b.json"
    _script().main(
        [
            "--model",
            str(tiny_model_path),
            "--prompts",
            "2",
            "--samples",
            "2",
            "--max-tokens",
            "6",
            "--max-turns",
            "3",
            "--repeat",
            "2",
            "--json",
            str(out_file),
        ]
    )
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out == json.loads(out_file.read_text())
    assert "single / multi tokens/s" in captured.err and len(out["load_average_start"]) == 3
    runs = out["runs"]
    assert [(r["round"], r["mode"]) for r in runs] == [
        (0, "multi"),
        (0, "single"),
        (1, "single"),
        (1, "multi"),
    ]
    multi = [r for r in runs if r["mode"] == "multi"]
    single = [r for r in runs if r["mode"] == "single"]
    for r in runs:
        assert r["rows"] == 4 and r["model_tokens"] > 0 and r["tokens_per_s"] > 0 and r["seconds"] > 0
        assert abs(r["tokens_per_s"] - r["model_tokens"] / r["seconds"]) <= 0.02 * r["tokens_per_s"] + 0.01
    for r in multi:
        assert (
            4 <= r["turns_played"] <= 4 * 3 and sum(t["generated"] for t in r["turns"]) == r["model_tokens"]
        )
        assert r["model_tokens"] <= 4 * 3 * 6 and r["turns"][0]["rows"] == 4
        assert r["tokens_prefilled"] == sum(t["prefilled"] for t in r["turns"]) > 0
        assert abs(r["prefill_s"] + r["decode_s"] + r["env_step_s"] + r["other_s"] - r["seconds"]) < 0.01
    assert multi[0]["model_tokens"] == multi[1]["model_tokens"]  # the same seed: the same episodes each round
    mean = max(1, round(multi[0]["model_tokens"] / 4))
    for r in single:  # no end token: every row decodes the multi-turn run's mean episode
        assert r["max_tokens"] == mean and r["model_tokens"] == 4 * mean and r["stopped"] == 0
    summary = out["summary"]
    assert summary["rows"] == 4 and summary["single_over_multi_tokens_per_s"] > 0
    assert summary["multi_tokens_per_s"] == min(multi, key=lambda r: r["seconds"])["tokens_per_s"]


def test_forced_calls_make_every_episode_play_every_turn(tiny_model_path, capsys):
    """--force-calls: the random model writes no call, so every turn but the last is stepped as a search."""
    out = _script().main(
        [
            "--model",
            str(tiny_model_path),
            "--prompts",
            "1",
            "--samples",
            "2",
            "--max-tokens",
            "4",
            "--max-turns",
            "3",
            "--force-calls",
        ]
    )
    capsys.readouterr()
    multi, single = out["runs"]
    assert multi["forced_calls"] == multi["tool_calls"] == 2 * 2 and multi["turns_played"] == 2 * 3
    assert [t["rows"] for t in multi["turns"]] == [2, 2, 2] and multi["observation_tokens"] > 0
    assert multi["tokens_prefilled"] > multi["observation_tokens"] and single["rows"] == 2
