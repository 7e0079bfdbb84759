"""Where a GRPO step's time goes, core by core: each phase's wall time and every thread's CPU time in it.

Runs `mlx-grpo train` with the given flags in this process and reads each thread's CPU time
(/proc/self/task/*/stat) at the edges of the step's phases: the rollout (sampling and scoring), the
update's preparation (micro-batches, the reference's pass) and the update itself. On MLX's CPU
backend every op runs on the stream's one thread, and OpenBLAS splits each matmul between that thread
and its own worker; so the worker's CPU time is about half the matmul time, and the stream thread's
time beyond the worker's is the work outside matmuls, on one core.

    python scripts/profile_cores.py --json cores.json -- --task ocaml --model FILE.gguf --steps 1 \\
        --batch-size 4 --group-size 8 --max-tokens 384 --temperature 0.8 --seed 0 --lora-rank 16 \\
        --lora-layers -1
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import emit_result, machine_line, markdown_table  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def thread_times() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process."""
    times = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that ended between the listing and the read
        times[int(task.name)] = (int(fields[11]) + int(fields[12])) / TICK
    return times


class Phases:
    """Wall and per-thread CPU seconds of each named phase, summed over the calls."""

    def __init__(self):
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, dict[int, float]] = {}

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            before, start = thread_times(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                after = thread_times()
                self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - start
                spent = self.cpu.setdefault(name, {})
                for tid, seconds in after.items():
                    spent[tid] = spent.get(tid, 0.0) + seconds - before.get(tid, 0.0)

        return timed

    def rows(self) -> list[dict]:
        main = threading_main_id()
        out = []
        for name, wall in self.wall.items():
            busy = sorted(((s, tid) for tid, s in self.cpu[name].items() if s > 0.01), reverse=True)
            total = sum(s for s, _ in busy)
            out.append(
                {
                    "phase": name,
                    "wall_s": round(wall, 2),
                    "cpu_s": round(total, 2),
                    "cores_busy": round(total / wall, 2) if wall else 0.0,
                    "threads": [
                        {
                            "tid": tid,
                            "main": tid == main,
                            "cpu_s": round(s, 2),
                            "busy": round(s / wall, 2) if wall else 0.0,
                        }
                        for s, tid in busy[:4]
                    ],
                }
            )
        return out


def threading_main_id() -> int:
    return os.getpid()  # the main thread's id is the process id on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("train_flags", nargs=argparse.REMAINDER, help="-- then the flags of mlx-grpo train")
    args = parser.parse_args()
    flags = [f for f in args.train_flags if f != "--"]

    from mlx_grpo.blas import blas_description, use_openblas

    use_openblas()  # re-executes this script with OpenBLAS preloaded, as the command does
    from mlx_grpo.run import trainer

    phases = Phases()
    trainer.collect_rollouts = phases.wrap("rollout", trainer.collect_rollouts)
    trainer.prepare_update = phases.wrap("prepare update", trainer.prepare_update)
    trainer.apply_update = phases.wrap("update", trainer.apply_update)
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    start = time.perf_counter()
    result = CliRunner().invoke(app, ["train", *flags], catch_exceptions=False)
    wall = time.perf_counter() - start
    rows = phases.rows()
    report = {
        "machine": machine_line(),
        "blas": blas_description(),
        "flags": flags,
        "exit_code": result.exit_code,
        "command_s": round(wall, 1),
        "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
        "phases": rows,
    }
    table = markdown_table(
        ["phase", "wall s", "CPU s", "cores busy", "busiest threads (CPU s, share of wall)"],
        [
            [
                r["phase"],
                r["wall_s"],
                r["cpu_s"],
                r["cores_busy"],
                ", ".join(
                    f"{'main' if t['main'] else t['tid']} {t['cpu_s']} ({t['busy']:.0%})"
                    for t in r["threads"]
                ),
            ]
            for r in rows
        ],
    )
    emit_result(report, args.json, table)


if __name__ == "__main__":
    main()
