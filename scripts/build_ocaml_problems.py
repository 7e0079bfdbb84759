"""Build rewards/ocaml_data/{train,test}.jsonl from the problem files beside them, and check it.

    python scripts/build_ocaml_problems.py            # write the JSONL files
    python scripts/build_ocaml_problems.py --check    # also grade every reference (needs ocaml)

Every fifth problem of ocaml_problems.txt (in file order, so each difficulty and
topic is spread over both) goes to the held-out test split, and the others to
train. Every problem of ocaml_test_problems.txt, written for the test split only
(enough held-out problems for a gain to be significant), follows them
in the test split.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "rewards" / "ocaml_data"
SOURCE = OUT / "ocaml_problems.txt"  # the sources live with the data, outside the wheel (JSONL only)
HELD_OUT = OUT / "ocaml_test_problems.txt"  # test split only
TEST_EVERY = 5
DIFFICULTIES = ("easy", "medium", "hard")


def parse(text: str, source: Path = SOURCE) -> list[dict]:
    problems, current, in_solution = [], None, False
    for number, line in enumerate(text.splitlines(), start=1):
        header = re.match(r"## (\S+) (\S+) (\S+)\s*$", line)
        if header:
            current = {
                "id": header[1],
                "difficulty": header[2],
                "topic": header[3],
                "prompt": "",
                "signature": "",
                "preamble": "",
                "tests": [],
                "solution": "",
            }
            problems.append(current)
            in_solution = False
            continue
        if current is None or (line.startswith("#") and not in_solution):
            continue
        if line.startswith("test: "):
            in_solution = False
            current["tests"].append(f"assert ({line[6:].strip()})")
        elif in_solution:
            current["solution"] += line + "\n"
        elif line.startswith("sig: "):
            current["signature"] = line[5:].strip()
        elif line.startswith("pre: "):
            current["preamble"] += line[5:].strip() + "\n"
        elif line.strip() == "sol:":
            in_solution = True
        elif line.strip():
            current["prompt"] += (" " if current["prompt"] else "") + line.strip()
    for p in problems:
        p["solution"] = p["solution"].strip() + "\n"
        problem_errors = [e for e in _errors(p)]
        if problem_errors:
            raise SystemExit(f"{source.name}: problem {p['id']}: {'; '.join(problem_errors)}")
    _check_unique(problems)
    return problems


def _check_unique(problems: list[dict]) -> None:
    """Ids, and the names of the functions asked for, each once."""
    for what, values in (
        ("ids", [p["id"] for p in problems]),
        ("function names", [_name(p["signature"]) for p in problems]),
    ):
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            raise SystemExit(f"duplicate {what}: {', '.join(duplicates)}")


def _name(signature: str) -> str:
    return re.match(r"let\s+(?:rec\s+)?(\S+)", signature)[1]


def _errors(p: dict):
    if p["difficulty"] not in DIFFICULTIES:
        yield f"difficulty {p['difficulty']!r} is not one of {DIFFICULTIES}"
    if not p["prompt"]:
        yield "no description"
    if not p["signature"].startswith("let ") or not p["signature"].endswith("="):
        yield "the signature must be `let name ... =`"
    if len(p["tests"]) < 4:
        yield f"only {len(p['tests'])} tests (at least 4)"
    name = _name(p["signature"])
    if not re.search(rf"\blet\s+(?:rec\s+)?{re.escape(name)}\b", p["solution"]):
        yield f"the solution does not define {name}"


def split(problems: list[dict], held_out: list[dict] = ()) -> tuple[list[dict], list[dict]]:
    """(train, test): every fifth of ``problems`` to test, then all of ``held_out``."""
    train = [p for i, p in enumerate(problems) if i % TEST_EVERY != TEST_EVERY - 1]
    test = [p for i, p in enumerate(problems) if i % TEST_EVERY == TEST_EVERY - 1]
    return train, test + list(held_out)


def load() -> tuple[list[dict], list[dict]]:
    """(train, test) from the two source files."""
    problems = parse(SOURCE.read_text(encoding="utf-8"))
    held_out = parse(HELD_OUT.read_text(encoding="utf-8"), HELD_OUT)
    _check_unique(problems + held_out)
    return split(problems, held_out)


def write(train: list[dict], test: list[dict]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, part in zip(("train", "test"), (train, test)):
        with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for p in part:
                f.write(json.dumps(p, ensure_ascii=False) + "\n")
        print(f"{OUT / name}.jsonl: {len(part)} problems")


def check(problems: list[dict]) -> int:
    """Grade every reference solution: each must pass all its tests."""
    sys.path.insert(0, str(ROOT))
    from rewards import ocaml

    start = time.monotonic()
    grades = ocaml.grade_many([f"```ocaml\n{p['solution']}```" for p in problems], problems)
    bad = [(p["id"], g) for p, g in zip(problems, grades) if g.score != 1.0]
    for pid, g in bad:
        print(f"FAIL {pid}: {g.stage} {g.tests_passed}/{g.tests_total} {g.error}")
    print(
        f"{len(problems) - len(bad)}/{len(problems)} references score 1.0 ({time.monotonic() - start:.1f} s)"
    )
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="grade every reference solution")
    args = parser.parse_args()
    train, test = load()
    write(train, test)
    problems = train + test
    by = {d: sum(p["difficulty"] == d for p in problems) for d in DIFFICULTIES}
    print(f"{len(problems)} problems: " + ", ".join(f"{n} {d}" for d, n in by.items()))
    return check(problems) if args.check else 0


if __name__ == "__main__":
    sys.exit(main())
