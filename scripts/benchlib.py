"""What the measuring scripts share (bench*.py, profile_*.py, decode_ceiling.py): a clock, the machine a
figure ran on and its load, a Markdown table, and the end that hands a result over: one JSON object on
stdout (so a pipe or a test reads stdout as JSON alone), the same text in the file its --out or --json
names, and a table for people on stderr.

Importing it loads no MLX: a script imports it before use_openblas() re-executes the process.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the clock


class Timer:
    """Wall-clock seconds (time.perf_counter) of a `with` block; read inside the block, the seconds so far."""

    def __enter__(self) -> Timer:
        self.began, self.ended = time.perf_counter(), None
        return self

    def __exit__(self, *exc) -> None:
        self.ended = time.perf_counter()

    @property
    def seconds(self) -> float:
        return (time.perf_counter() if self.ended is None else self.ended) - self.began


def run_seconds(run, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of run() (which waits for what it computes), after one warm-up
    call: the first touch of the weights and of the allocator's buffers is no call's cost."""
    run()
    times = []
    for _ in range(repeats):
        with Timer() as timer:
            run()
        times.append(timer.seconds)
    return times


# ---------------------------------------------------------------- the machine


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages, to two places (on a shared machine other work slows a figure)."""
    return [round(x, 2) for x in os.getloadavg()]


def load_since(start: list[float]) -> dict:
    """The load averages when a measurement began (load_average() then) and now."""
    return {"start": start, "end": load_average()}


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform module says."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def command_output(command: list[str]) -> str | None:
    """A command's stdout (run in the repository), or None when it cannot run."""
    try:
        return subprocess.run(
            command, capture_output=True, text=True, cwd=str(ROOT), timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict:
    """The machine and the code a figure came from: CPU, cores, `uptime` (its load), the commit and whether
    tracked files differ from it, and the versions of MLX, mlx-lm and Python."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    dirty = command_output(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "uptime": command_output(["uptime"]),
        "commit": command_output(["git", "rev-parse", "HEAD"]),
        "dirty": bool(dirty),
        "mlx": installed("mlx"),
        "mlx_lm": installed("mlx-lm"),
        "python": platform.python_version(),
    }


def machine_line() -> str:
    """One line for a report: the CPU and its cores, the BLAS under MLX's CPU matmuls, MLX's device."""
    import mlx.core as mx

    from mlx_grpo.blas import blas_description

    return f"{cpu_model()}, {os.cpu_count()} cores; {blas_description()}; MLX {mx.default_device()}"


# ---------------------------------------------------------------- the output


def markdown_table(headings: list[str], rows: list[list]) -> str:
    """A Markdown table: the headings, the rule, then one line per row (its cells as str() gives them)."""
    lines = ["| " + " | ".join(headings) + " |", "|" + "---|" * len(headings)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def emit_result(result: dict, path: str | Path | None, table: str | None = None, indent: int = 2) -> None:
    """Write `result` as JSON to `path` (when given) and to stdout, then `table` (when given) to stderr."""
    text = json.dumps(result, indent=indent)
    if path:
        Path(path).write_text(text + "\n")
    print(text)
    if table is not None:
        print(table, file=sys.stderr)
