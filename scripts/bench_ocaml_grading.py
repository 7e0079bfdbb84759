"""How many completions per second the OCaml grader handles, by worker count.

    python scripts/bench_ocaml_grading.py [--workers 1 2 4 8] [--rounds 1]

The completions are a realistic mix for every shipped problem: the reference
(passes), a wrong answer that builds (fails tests), one that does not type-check
and one that does not parse, so both the build-and-run path and the diagnose path
are timed. Prints one line per worker count.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path

from benchlib import Timer, cpu_model  # noqa: E402

from rewards import ocaml  # noqa: E402
from rewards.sandbox import capabilities  # noqa: E402


def completions_for(problem: dict) -> list[str]:
    sig = problem["signature"]
    return [
        f"```ocaml\n{problem['solution']}```",
        f'```ocaml\n{sig}\n  failwith "todo"\n```',  # builds, every test fails
        f'```ocaml\n{sig}\n  "not the right type" + 1\n```',  # type error
        f"```ocaml\n{sig}\n  let x = in\n```",  # syntax error
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    problems = ocaml.problems("train") + ocaml.problems("test")
    pairs = [(c, p) for p in problems for c in completions_for(p)] * args.rounds
    print(f"{len(pairs)} completions; {cpu_model()}, {os.cpu_count()} CPUs; sandbox {capabilities()}")
    for workers in args.workers:
        with Timer() as timer:
            grades = ocaml.grade_many([c for c, _ in pairs], [p for _, p in pairs], workers=workers)
        seconds = timer.seconds
        stages = {s: sum(g.stage == s for g in grades) for s in ocaml.STAGES}
        print(f"workers {workers}: {len(pairs) / seconds:.1f} completions/s ({seconds:.1f} s) {stages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
