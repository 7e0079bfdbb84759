"""Where an OCaml compare's answers fail: the grader's stage of every answer, base against trained.

    python scripts/ocaml_failure_stages.py RUN/compare/rows.jsonl [--json OUT]

Each answer of `mlx-grpo compare --task ocaml` is graded again (the task's own grader, the same
sandbox) and counted by the stage it reached: syntax_error, type_error, compile_error (the
solution alone type-checks, the program with the tests does not), tests (builds, fails a test),
constant, passed. For the answers that do not build, the commonest first compiler errors and
the unbound names (standard-library functions that do not exist, `%` for `mod`) are listed:
what a recipe has taught shows as answers moving down this ladder before they pass.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rewards.ocaml.pool import grade_many  # noqa: E402

BUILD_FAILURES = ("syntax_error", "type_error", "compile_error")


def error_kind(error: str) -> str:
    """The compiler's message without its particulars, so that like errors count together."""
    found = re.search(r"Error: (.*)", error)
    message = found.group(1) if found else (error.splitlines()[-1] if error else "")
    return re.sub(r"Unbound value \S+", "Unbound value X", message)[:70]


def stages(answers: list[tuple[str, dict]]) -> dict:
    """Stage counts, the commonest build errors and unbound names of (answer, problem) pairs."""
    grades = grade_many([answer for answer, _ in answers], [problem for _, problem in answers])
    failed = [g.error for g in grades if g.stage in BUILD_FAILURES]
    unbound = Counter(m.group(1) for e in failed for m in [re.search(r"Unbound value (\S+)", e)] if m)
    return {"stages": dict(Counter(g.stage for g in grades)),
            "build_errors": Counter(map(error_kind, failed)).most_common(10),
            "unbound": unbound.most_common(10)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", help="a compare's rows.jsonl (task ocaml)")
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args()
    rows = [json.loads(line) for line in open(args.rows)]
    report = {}
    for side in ("base", "trained"):
        answers = [(answer, row["columns"]) for row in rows for answer in row[side]["completions"]]
        report[side] = found = stages(answers)
        print(f"{side}: {len(answers)} answers: " + ", ".join(f"{k} {v}" for k, v in sorted(found["stages"].items())))
        for kind, n in found["build_errors"]:
            print(f"  {n:4d}  {kind}")
        print("  unbound: " + ", ".join(f"{name} {n}" for name, n in found["unbound"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
