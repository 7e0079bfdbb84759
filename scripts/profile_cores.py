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
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import emit_result, machine_line, markdown_table  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PERF_RATE = 199  # samples a second of each thread


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
        self.spans: list[
            tuple[str, float, float]
        ] = []  # (phase, start, end) on CLOCK_MONOTONIC, as `perf -k`

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            before, start, began = (
                thread_times(),
                time.perf_counter(),
                time.clock_gettime(time.CLOCK_MONOTONIC),
            )
            try:
                return fn(*args, **kwargs)
            finally:
                after = thread_times()
                self.spans.append((name, began, time.clock_gettime(time.CLOCK_MONOTONIC)))
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


WAITING = (
    "thread_server",
    "sched_yield",
    "__schedule",
    "schedule",
    "finish_task_switch",
    "do_syscall_64",
    "_raw_spin_unlock",
    "futex",
    "entry_SYSCALL",
    "syscall_exit",
    "pthread_cond",
    "nanosleep",
)
MLX_COMPILED = "libC"  # the shared objects MLX compiles fused elementwise kernels into


def classify(dso: str, symbol: str) -> str:
    """What a CPU sample was doing: BLAS arithmetic or packing, waiting, MLX's other ops, page faults, ..."""
    if any(w in symbol for w in WAITING):
        return "waiting (yield, sleep)"
    if "openblas" in dso or "libblas" in dso:
        return "matmul packing" if "copy" in symbol else "matmul arithmetic"
    if "libmlx" in dso or Path(dso).name.startswith(MLX_COMPILED) or "libm.so" in dso:
        return "MLX's other ops"
    if dso.startswith("[kernel"):
        return "kernel: page faults, copies" if "page" in symbol or "fault" in symbol else "kernel: other"
    return "Python, malloc and the rest"


def perf_shares(data: str, spans: list[tuple[str, float, float]]) -> list[dict]:
    """Samples of `perf record -k CLOCK_MONOTONIC` by phase, thread and what they were doing."""
    text = subprocess.run(
        ["perf", "script", "-i", data, "-F", "tid,time,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: dict[tuple[str, int, str], int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[1].endswith(":"):
            continue
        tid, stamp = int(parts[0]), float(parts[1][:-1])
        dso = line[line.rfind("(") + 1 : line.rfind(")")] if "(" in line else "[unknown]"
        symbol = " ".join(parts[2:])
        phase = next((name for name, a, b in spans if a <= stamp <= b), None)
        if phase is not None:
            key = (phase, tid, classify(dso, symbol))
            counts[key] = counts.get(key, 0) + 1
    return [{"phase": p, "tid": t, "doing": d, "samples": n} for (p, t, d), n in sorted(counts.items())]


def doing_table(samples: list[dict], phase_names: list[str]) -> str:
    """CPU seconds each phase spent on each kind of work, over every thread."""
    doing = sorted({r["doing"] for r in samples})
    seconds: dict[tuple[str, str], float] = {}
    for r in samples:
        key = (r["phase"], r["doing"])
        seconds[key] = seconds.get(key, 0.0) + r["samples"] / PERF_RATE
    rows = [[p, *(round(seconds.get((p, d), 0.0), 1) for d in doing)] for p in dict.fromkeys(phase_names)]
    return "CPU seconds by what they did (every thread, perf samples):\n" + markdown_table(
        ["phase", *doing], rows
    )


def threading_main_id() -> int:
    return os.getpid()  # the main thread's id is the process id on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--perf",
        metavar="FILE",
        help="also sample every thread with `perf record` into FILE and "
        "say what each phase's samples were doing (matmul, BLAS waiting, MLX's other ops, ...)",
    )
    parser.add_argument(
        "--analyse",
        metavar="JSON",
        help="read the perf samples of an earlier --perf run again "
        "(its --json report names the phases) and print what they did; trains nothing",
    )
    parser.add_argument("train_flags", nargs=argparse.REMAINDER, help="-- then the flags of mlx-grpo train")
    args = parser.parse_args()
    flags = [f for f in args.train_flags if f != "--"]
    if args.analyse:
        earlier = json.loads(Path(args.analyse).read_text())
        spans = [tuple(span) for span in earlier["spans"]]
        print(doing_table(perf_shares(args.perf, spans), [name for name, *_ in spans]))
        return

    from mlx_grpo.blas import blas_description, use_openblas

    use_openblas()  # re-executes this script with OpenBLAS preloaded, as the command does
    from mlx_grpo.run import trainer

    phases = Phases()
    trainer.collect_rollouts = phases.wrap("rollout", trainer.collect_rollouts)
    trainer.prepare_update = phases.wrap("prepare update", trainer.prepare_update)
    trainer.apply_update = phases.wrap("update", trainer.apply_update)
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    recorder = None
    if args.perf:  # after the re-execution above, so perf follows the process that trains
        recorder = subprocess.Popen(
            [
                "perf",
                "record",
                "-q",
                "-k",
                "CLOCK_MONOTONIC",
                "-F",
                str(PERF_RATE),
                "-p",
                str(os.getpid()),
                "-o",
                args.perf,
            ]
        )
        time.sleep(1.0)
    start = time.perf_counter()
    result = CliRunner().invoke(app, ["train", *flags], catch_exceptions=False)
    wall = time.perf_counter() - start
    if recorder is not None:
        recorder.send_signal(signal.SIGINT)
        recorder.wait()
    rows = phases.rows()
    report = {
        "machine": machine_line(),
        "blas": blas_description(),
        "flags": flags,
        "exit_code": result.exit_code,
        "command_s": round(wall, 1),
        "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2),
        "phases": rows,
        "spans": phases.spans,
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
    if args.perf:
        report["perf"] = perf_shares(args.perf, phases.spans)
        table += "\n\n" + doing_table(report["perf"], list(phases.wall))
    emit_result(report, args.json, table)


if __name__ == "__main__":
    main()
