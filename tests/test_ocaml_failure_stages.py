"""scripts/ocaml_failure_stages.py: a compare's answers counted by the grader's stage, hand-made cases."""

import importlib.util
import json
from pathlib import Path

from marks import needs_ocaml

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("ocaml_failure_stages", ROOT / "scripts" / "ocaml_failure_stages.py")
failure_stages = importlib.util.module_from_spec(spec)
spec.loader.exec_module(failure_stages)

PROBLEM = {"signature": "let double (n : int) : int =", "preamble": "",
           "tests": ["assert (double 2 = 4)", "assert (double 0 = 0)"]}
RIGHT = "```ocaml\nlet double (n : int) : int = n * 2\n```"
WRONG = "```ocaml\nlet double (n : int) : int = n + 2\n```"
NO_IN = "```ocaml\nlet double (n : int) : int =\n  let m = n * 2\n  m\n```"  # F#'s let without `in`
UNBOUND = "```ocaml\nlet double (n : int) : int = List.twice n\n```"
BAD_MOD = "```ocaml\nlet double (n : int) : int = n % 2\n```"


def test_error_kind_drops_the_name_of_an_unbound_value():
    assert failure_stages.error_kind('File "main.ml", line 2:\nError: Unbound value List.last') == "Unbound value X"
    assert failure_stages.error_kind("Error: Syntax error") == "Syntax error"


@needs_ocaml
def test_each_answer_is_counted_at_the_stage_it_reached():
    found = failure_stages.stages([(a, PROBLEM) for a in (RIGHT, WRONG, NO_IN, UNBOUND, BAD_MOD)])
    assert found["stages"] == {"passed": 1, "tests": 1, "syntax_error": 1, "type_error": 2}
    assert dict(found["unbound"]) == {"List.twice": 1, "%": 1}
    assert dict(found["build_errors"])["Unbound value X"] == 2


@needs_ocaml
def test_the_command_reports_both_sides(tmp_path, monkeypatch, capsys):
    row = {"columns": PROBLEM, "base": {"completions": [NO_IN]}, "trained": {"completions": [RIGHT]}}
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    monkeypatch.setattr("sys.argv", ["ocaml_failure_stages.py", str(rows), "--json", str(tmp_path / "out.json")])
    failure_stages.main()
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["base"]["stages"] == {"syntax_error": 1}
    assert report["trained"]["stages"] == {"passed": 1}
    assert "trained: 1 answers: passed 1" in capsys.readouterr().out
