"""Write a file of web tasks for `mlx-grpo compare --task web --data FILE`.

Each seed in the range gives one task of every kind (4 families x 3 difficulties) in its own
world, one JSONL row each: {"family", "difficulty", "seed"} (rewards/web_browsing/tasks.py's
make_task). Rows go seed by seed, every kind in turn, so the first rows of the file cover
every kind:

    python scripts/web_tasks.py --seeds 1000-1007 --out held_out.jsonl   # 96 tasks

A kind with no possible task in a seed's world is left out and reported.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rewards.web_browsing.tasks import DIFFICULTIES, FAMILIES, make_task  # noqa: E402


def parse_seeds(text: str) -> list[int]:
    """ "1000-1007" -> 1000..1007 (both ends); "5" -> [5]; "1,4,9" -> those."""
    seeds = []
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            seeds += range(int(first), int(last or first) + 1)
    except ValueError:
        raise ValueError(
            f"--seeds: expected a range such as 1000-1007 or a list such as 1,4,9, not {text!r}"
        ) from None
    if not seeds:
        raise ValueError(f"--seeds: {text!r} names no seed")
    return seeds


def task_rows(seeds: list[int]) -> tuple[list[dict], list[str]]:
    """(rows, the kinds left out as "family/difficulty@seed")."""
    rows, left_out = [], []
    for seed in seeds:
        for family in FAMILIES:
            for difficulty in DIFFICULTIES:
                try:
                    make_task(family, difficulty, seed)
                except ValueError:  # this world has no task of the kind
                    left_out.append(f"{family}/{difficulty}@{seed}")
                    continue
                rows.append({"family": family, "difficulty": difficulty, "seed": seed})
    return rows, left_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", required=True, help="world seeds: a range 1000-1007 or a list 1,4,9")
    parser.add_argument("--out", required=True, type=Path, help="the JSONL file to write")
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, left_out = task_rows(seeds)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    kinds = {(r["family"], r["difficulty"]) for r in rows}
    print(f"wrote {len(rows)} tasks of {len(kinds)} kinds from {len(seeds)} seeds to {args.out}")
    if left_out:
        print(f"left out (no such task in that world): {', '.join(left_out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
