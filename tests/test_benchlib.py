"""scripts/benchlib.py: the clock, the machine, the table and the end the measuring scripts share."""

import importlib.util
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("benchlib", ROOT / "scripts" / "benchlib.py")
benchlib = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchlib)

RESULT = {"step_s": 1.5, "runs": [{"mode": "after", "tokens": 3}], "name": "tiny"}


def test_stdout_is_the_json_alone_the_file_the_same_text_and_the_table_on_stderr(capsys, tmp_path):
    path = tmp_path / "out.json"
    benchlib.emit_result(RESULT, str(path), "| a | b |\n| 1 | 2 |")
    printed = capsys.readouterr()
    text = (
        '{\n  "step_s": 1.5,\n  "runs": [\n    {\n      "mode": "after",\n'
        '      "tokens": 3\n    }\n  ],\n  "name": "tiny"\n}'
    )
    assert printed.out == text + "\n" and path.read_text() == text + "\n"
    assert printed.err == "| a | b |\n| 1 | 2 |\n"


def test_without_a_path_nothing_is_written_and_the_indent_is_the_callers(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    benchlib.emit_result(RESULT, None, "table", indent=1)
    printed = capsys.readouterr()
    assert printed.out == json.dumps(RESULT, indent=1) + "\n" and printed.out.startswith('{\n "step_s"')
    assert printed.err == "table\n" and list(tmp_path.iterdir()) == []


def test_without_a_table_stderr_stays_empty(capsys):
    benchlib.emit_result(RESULT, None)
    printed = capsys.readouterr()
    assert json.loads(printed.out) == RESULT and printed.err == ""


def test_the_timer_reads_the_block_and_stops_at_its_end():
    with benchlib.Timer() as timer:
        time.sleep(0.02)
        inside = timer.seconds
        time.sleep(0.02)
    after = timer.seconds
    assert 0.02 <= inside < after and after >= 0.04
    time.sleep(0.01)
    assert timer.seconds == after  # stopped: reading it later gives the block's time


def test_run_seconds_leaves_the_warm_up_call_out():
    calls = []

    def run():
        time.sleep(0.05 if not calls else 0.0)  # only the first (warm-up) call is slow
        calls.append(1)

    times = benchlib.run_seconds(run, 3)
    assert len(calls) == 4 and len(times) == 3 and max(times) < 0.04


def test_the_markdown_table_by_hand():
    table = benchlib.markdown_table(["trainer", "step s", "peak"], [["ours", "0.12", 1], ["peer", "", None]])
    assert table == ("| trainer | step s | peak |\n|---|---|---|\n| ours | 0.12 | 1 |\n| peer |  | None |")


def test_the_cpu_model_is_cpuinfos_model_name_or_the_platforms(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"
    )
    assert benchlib.cpu_model(cpuinfo) == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    assert benchlib.cpu_model(tmp_path / "missing")  # no /proc (macOS): still names something


def test_the_load_since_a_start_keeps_the_start_and_reads_the_end():
    load = benchlib.load_since([9.0, 8.0, 7.0])
    assert load["start"] == [9.0, 8.0, 7.0] and len(load["end"]) == 3
    assert all(x == round(x, 2) for x in load["end"])
