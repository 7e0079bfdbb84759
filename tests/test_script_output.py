"""scripts/script_output.py: the end the measuring scripts share (bench, bench_sft, profile_sft, profile_update)."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("script_output", ROOT / "scripts" / "script_output.py")
script_output = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script_output)

RESULT = {"step_s": 1.5, "runs": [{"mode": "after", "tokens": 3}], "name": "tiny"}


def test_stdout_is_the_json_alone_the_file_the_same_text_and_the_table_on_stderr(capsys, tmp_path):
    path = tmp_path / "out.json"
    script_output.emit_result(RESULT, str(path), "| a | b |\n| 1 | 2 |")
    printed = capsys.readouterr()
    text = '{\n  "step_s": 1.5,\n  "runs": [\n    {\n      "mode": "after",\n      "tokens": 3\n    }\n  ],\n  "name": "tiny"\n}'
    assert printed.out == text + "\n" and path.read_text() == text + "\n"
    assert printed.err == "| a | b |\n| 1 | 2 |\n"


def test_without_a_path_nothing_is_written_and_the_indent_is_the_callers(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script_output.emit_result(RESULT, None, "table", indent=1)
    printed = capsys.readouterr()
    assert printed.out == json.dumps(RESULT, indent=1) + "\n" and printed.out.startswith('{\n "step_s"')
    assert printed.err == "table\n" and list(tmp_path.iterdir()) == []
