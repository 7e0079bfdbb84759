"""Grading one completion: what each stage is worth, the toolchain, runaway output, and the
staged build-and-test run in a sandbox."""

from __future__ import annotations

import os
import secrets
import shutil
import time
import zlib
from dataclasses import dataclass, field

from .. import completion_text
from ..sandbox import Limits, Sandbox
from .source import assemble, extract_code, function_name, ignores_its_input, program, with_preamble
from .testcode import count_tests

STAGES = ("no_code", "syntax_error", "type_error", "compile_error", "constant", "tests", "passed")


@dataclass(frozen=True)
class StageWeights:
    """Score of each stage; a build that runs earns ``compiles`` plus its share of tests passed."""

    syntax_error: float = 0.0  # also no code at all
    type_error: float = 0.1  # parses
    compile_error: float = 0.2  # type-checks on its own
    constant: float = 0.0  # builds, fails a test, and uses none of its parameters (source.ignores_its_input)
    compiles: float = 0.3  # builds with the tests; k of n passing adds (1 - compiles) * k / n

    def value(self, stage: str, passed: int, total: int) -> float:
        if stage in ("no_code", "syntax_error"):
            return self.syntax_error
        if stage == "type_error":
            return self.type_error
        if stage == "compile_error":
            return self.compile_error
        if stage == "constant":
            return self.constant
        if passed >= total:
            return 1.0  # exactly, whatever the rounding of the line below
        return self.compiles + (1.0 - self.compiles) * passed / max(total, 1)


@dataclass(frozen=True)
class GradeConfig:
    weights: StageWeights = field(default_factory=StageWeights)
    runaway_penalty: float = 0.3  # score factor for runaway completions (1: off)
    penalize_cut: bool = True  # cut at the length limit without the closing fence
    penalize_repetition: bool = True  # degenerate, repetitive output
    repeated_lines: int = 6  # this many identical consecutive non-blank lines is degenerate
    min_compression: float = 0.12  # zlib ratio of the last 1,000 chars below this is degenerate
    compile_limits: Limits = field(
        default_factory=lambda: Limits(cpu_s=10, wall_s=20, memory_mb=1024, file_mb=64, processes=16)
    )
    # Every reference runs in well under 0.1 s: 1 CPU second is plenty, and a batch full
    # of infinite loops stays within the trainer's reward_timeout.
    run_limits: Limits = field(
        default_factory=lambda: Limits(cpu_s=1, wall_s=3, memory_mb=1024, file_mb=16, processes=16)
    )


DEFAULT = GradeConfig()
# The training reward: the trainer's runaway_penalty already handles cuts at max_tokens.
TRAINING = GradeConfig(penalize_cut=False)


# ---------------------------------------------------------------------------
# Toolchain


INSTALL_HINT = (
    "the OCaml toolchain is missing (`ocaml` and `ocamlc` must be on PATH): install it with "
    "`apt-get install ocaml-nox` (Debian/Ubuntu) or `brew install ocaml` (macOS)"
)


def toolchain_path() -> str | None:
    """The folder holding ocamlc (with ocaml beside it on PATH), or None."""
    ocamlc, ocaml = shutil.which("ocamlc"), shutil.which("ocaml")
    return os.path.dirname(ocamlc) if ocamlc and ocaml else None


def require_toolchain() -> str:
    """The toolchain's folder; without one, a one-line error saying how to install it."""
    where = toolchain_path()
    if where is None:
        try:  # a ConfigError in the CLI prints as one line and exits 2
            from mlx_grpo.config import ConfigError as error_class
        except ImportError:
            error_class = ValueError
        raise error_class(INSTALL_HINT)
    return where


# ---------------------------------------------------------------------------
# Runaway output


def is_repetitive(text: str, config: GradeConfig = DEFAULT) -> bool:
    """Degenerate output: a line repeated many times in a row, or a tail that compresses like a loop."""
    run, previous = 0, None
    for line in (line.strip() for line in text.splitlines()):
        if not line:
            continue
        run = run + 1 if line == previous else 1
        previous = line
        if run >= config.repeated_lines:
            return True
    tail = text[-1000:].encode("utf-8")
    # Code compresses to 0.3-0.5 of its size; a short unit repeated over and over to far less.
    return len(tail) >= 400 and len(zlib.compress(tail, 9)) / len(tail) < config.min_compression


def is_cut(text: str, finish_reason: str | None = None) -> bool:
    """Cut at the length limit without the end marker (the closing code fence)."""
    fences = text.count("```")
    unclosed = fences % 2 == 1
    if finish_reason is not None:
        return finish_reason == "length" and (unclosed or fences == 0)
    return unclosed


def runaway_reason(text: str, config: GradeConfig = DEFAULT, finish_reason: str | None = None) -> str | None:
    if config.penalize_cut and is_cut(text, finish_reason):
        return "cut"
    if config.penalize_repetition and is_repetitive(text, config):
        return "repetitive"
    return None


# ---------------------------------------------------------------------------
# Grading


@dataclass
class Grade:
    score: float  # after the runaway penalty
    stage: str  # one of STAGES: the furthest stage reached
    tests_passed: int
    tests_total: int
    base_score: float  # before the runaway penalty
    runaway: str | None = None  # "cut" | "repetitive" | None
    error: str = ""  # the compiler's first error lines, or why the run ended
    seconds: float = 0.0


def _first_error(text: str, max_lines: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("File ")), 0)
    return "\n".join(lines[start : start + max_lines])


def _count_passes(stdout: str, marker: str, total: int) -> int:
    passed = set()
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == marker and parts[1].isdigit() and int(parts[1]) < total:
            passed.add(int(parts[1]))
    return len(passed)


def _stage_of_failed_build(box: Sandbox, limits: Limits) -> str:
    """Why the build failed: the solution alone type-checks, parses, or neither."""
    # Parsing first: it is the commonest failure of a weak model, and the cheapest check.
    if not box.run(["ocamlc", "-w", "-a", "-stop-after", "parsing", "-c", "solution.ml"], limits).ok:
        return "syntax_error"
    if not box.run(["ocamlc", "-w", "-a", "-stop-after", "typing", "-c", "solution.ml"], limits).ok:
        return "type_error"
    return "compile_error"


def grade(
    completion, problem: dict, config: GradeConfig = DEFAULT, finish_reason: str | None = None
) -> Grade:
    """Grade one completion against one problem (``signature``, ``tests``, optional ``preamble``)."""
    start = time.monotonic()
    path = require_toolchain()
    text = completion_text(completion)
    tests = problem["tests"]
    total = count_tests(tests)  # a ValueError for tests that are neither a list of strings nor a string
    preamble = problem.get("preamble") or ""
    runaway = runaway_reason(text, config, finish_reason)
    stage, passed, error = "no_code", 0, ""
    code = extract_code(text, function_name(problem["signature"]))
    if code.strip():
        source = assemble(code, problem["signature"])
        marker = "PASS-" + secrets.token_hex(8)
        env_path = f"{path}:/usr/local/bin:/usr/bin:/bin"
        with Sandbox(config.run_limits, path=env_path, prefix="ocaml-grade-") as box:
            name = function_name(problem["signature"])
            box.write("main.ml", program(source, name, preamble, tests, marker))
            build = box.run(["ocamlc", "-w", "-a", "-o", "main", "main.ml"], config.compile_limits)
            if build.ok:
                run = box.run(["./main"], config.run_limits)
                passed = _count_passes(run.stdout, marker, total)
                stage = (
                    "passed"
                    if passed == total
                    else "constant"
                    if ignores_its_input(source, name)
                    else "tests"
                )
                if run.timed_out:
                    error = "timed out"
                elif run.output_capped:
                    error = "too much output"
                elif run.returncode != 0:
                    error = _first_error(run.stderr) or f"exit status {run.returncode}"
            else:
                box.write("solution.ml", with_preamble(source, preamble) + "\n")
                stage = _stage_of_failed_build(box, config.compile_limits)
                error = "timed out" if build.timed_out else _first_error(build.stderr)
    else:
        error = "no code"
    base = config.weights.value(stage, passed, total)
    factor = config.runaway_penalty if runaway else 1.0
    return Grade(base * factor, stage, passed, total, base, runaway, error, time.monotonic() - start)


def score(completion: str, problem: dict, config: GradeConfig = DEFAULT) -> float:
    """The public entry point: 0.0 (nothing usable) to 1.0 (all tests pass)."""
    return grade(completion, problem, config).score
