"""The task "ocaml": the model writes an OCaml function; a sandboxed compile and test run grades it.

Problems ship in ``rewards/ocaml_data/{train,test}.jsonl``, one JSON object a line:
``id``, ``difficulty``, ``topic``, ``prompt`` (the description), ``signature``
(``let rev_list (xs : int list) : int list =``), ``preamble`` (type definitions the
problem gives, often ""), ``tests`` (a list of OCaml ``assert`` expressions, or one
string of OCaml test code: see ``rewards.ocaml_testcode``) and ``solution`` (the
reference). The shipped ones are built from ``scripts/ocaml_problems.txt`` by
``scripts/build_ocaml_problems.py``.

Grading (``grade``; ``score`` is its number) goes through stages, each worth more:

    stage           reached when                                   default score
    no_code         nothing to compile                             0.0
    syntax_error    the code does not parse                        0.0
    type_error      parses, fails the type check                   0.1
    compile_error   type-checks alone, fails to build with tests   0.2
    tests           builds; k of n tests pass                      0.3 + 0.7 k/n
    passed          every test passes                              1.0

Every step up the ladder, and every extra test passed, is worth something, so
completions in a group rarely all score the same (a hard cap did that in seed 001
and nothing was learned).

The runaway penalty multiplies the score by 0.3 (``GradeConfig.runaway_penalty``)
for completions that were cut at the length limit without the end marker (the
closing code fence) and for degenerate, repetitive output. A reward function only
sees text: it knows a completion was cut when a ``finish_reason`` column says
"length", or, failing that, from an opened code fence that never closes. The
trainer applies its own ``runaway_penalty`` to completions cut at ``max_tokens``,
so the task's reward leaves the cut to it (no double penalty) and penalises
repetition only; ``score``/``grade`` used on their own do both.

The program runs in ``rewards.sandbox`` (own uid, process group, limits, no network).
Tests run one by one, each printing a random marker when it passes, so a crash or
a timeout in test 3 still counts tests 1-2. The solution is wrapped in a module and
the tests see only its function and the problem's types, so a solution cannot
redefine ``=`` (or anything else) to pass them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import threading
import time
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rewards import completion_text
from rewards.ocaml_testcode import Test, count_tests, test_error, test_items, tests_key
from rewards.sandbox import Limits, Sandbox

DATA_DIR = Path(__file__).parent / "ocaml_data"

SYSTEM_PROMPT = (
    "You are an expert OCaml programmer. Answer with the complete OCaml definition "
    "in a single ```ocaml code block, and nothing else."
)

INSTALL_HINT = ("the OCaml toolchain is missing (`ocaml` and `ocamlc` must be on PATH): install it with "
                "`apt-get install ocaml-nox` (Debian/Ubuntu) or `brew install ocaml` (macOS)")

STAGES = ("no_code", "syntax_error", "type_error", "compile_error", "tests", "passed")


# ---------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class StageWeights:
    """Score of each stage; a build that runs earns ``compiles`` plus its share of tests passed."""

    syntax_error: float = 0.0  # also no code at all
    type_error: float = 0.1  # parses
    compile_error: float = 0.2  # type-checks on its own
    compiles: float = 0.3  # builds with the tests; k of n passing adds (1 - compiles) * k / n

    def value(self, stage: str, passed: int, total: int) -> float:
        if stage in ("no_code", "syntax_error"):
            return self.syntax_error
        if stage == "type_error":
            return self.type_error
        if stage == "compile_error":
            return self.compile_error
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
    compile_limits: Limits = field(default_factory=lambda: Limits(cpu_s=10, wall_s=20, memory_mb=1024,
                                                                   file_mb=64, processes=16))
    # Every reference runs in well under 0.1 s: 1 CPU second is plenty, and a batch full
    # of infinite loops stays within the trainer's reward_timeout.
    run_limits: Limits = field(default_factory=lambda: Limits(cpu_s=1, wall_s=3, memory_mb=1024,
                                                               file_mb=16, processes=16))


DEFAULT = GradeConfig()
# The training reward: the trainer's runaway_penalty already handles cuts at max_tokens.
TRAINING = GradeConfig(penalize_cut=False)


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


# ---------------------------------------------------------------------------
# Toolchain


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
# From completion to program

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(```|\Z)", re.S)
_NAME = re.compile(r"\blet\s+(?:rec\s+)?([a-z_][A-Za-z0-9_']*)")


def function_name(signature: str) -> str:
    match = _NAME.search(signature)
    if not match:
        raise ValueError(f"no `let name` in the signature {signature!r}")
    return match.group(1)


def extract_code(text: str, name: str | None = None) -> str:
    """The code of a completion: a fenced block (the one defining ``name`` if several) or the raw text."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    if not blocks:
        return text.strip()
    preferred = [code for lang, code in blocks if lang in ("ocaml", "ml", "")] or [code for _, code in blocks]
    if name:
        defines = re.compile(rf"\b(?:let|and)\s+(?:rec\s+)?{re.escape(name)}\b")
        for code in preferred:
            if defines.search(code):
                return code.strip()
    return preferred[0].strip()


def assemble(code: str, signature: str) -> str:
    """The completion's code as a full definition: used as is when it defines the function,
    else taken as the body below the signature (made ``let rec``, which costs nothing when
    the body does not recurse)."""
    name = function_name(signature)
    if re.search(rf"\b(?:let|and)\s+(?:rec\s+)?{re.escape(name)}\b", code):
        return code
    head = signature if re.match(r"\s*let\s+rec\b", signature) else re.sub(r"^\s*let\b", "let rec", signature, 1)
    return head + "\n" + "\n".join("  " + line for line in code.splitlines())


def with_preamble(source: str, preamble: str) -> str:
    """The problem's type definitions, then the solution.

    They go inside ``include struct ... end`` because a completion often
    repeats them, and OCaml refuses a type defined twice in one structure but
    lets a later definition shadow an included one (the tests then use the
    completion's own, usually identical, type).
    """
    if not preamble.strip():
        return source
    return f"include struct\n{preamble.strip()}\nend\n{source}"


_TYPE_HEAD = re.compile(r"^(\s*(?:type|and)\s+)((?:'\w+\s+|\([^)]*\)\s*)?)([a-z_]\w*)\s*=\s*", re.M)


def _reexport(preamble: str) -> str:
    """The problem's types as seen from the test unit: ``type point = Solution.point = {...}``
    (the same type, with its fields and constructors in scope)."""
    out, last = [], 0
    for m in _TYPE_HEAD.finditer(preamble):
        out.append(preamble[last:m.start()])
        rest = preamble[m.end():m.end() + 1]
        alias = f"{m[2]}Solution.{m[3]}"
        if rest in ("{", "|") or rest.isupper():  # record or variant: keep the definition, checked equal
            out.append(f"{m[1]}{m[2]}{m[3]} = {alias} = ")
            last = m.end()
        else:  # an alias: the solution's is enough
            end = preamble.find("\n", m.end())
            out.append(f"{m[1]}{m[2]}{m[3]} = {alias}")
            last = len(preamble) if end < 0 else end
    return "".join(out) + preamble[last:]


def program(source: str, name: str, preamble: str, tests: list[str] | str, marker: str) -> str:
    """The solution inside ``module Solution = struct ... end``, then the tests outside it.

    The tests see the solution's function and the problem's types only, so nothing
    else the solution defines (a new ``=``, a module named Stdlib) can change what
    they mean. (One file rather than two units: a point-free definition with a weak
    type variable is then fixed by its use in the tests, as it would be in the
    toplevel.) Each test prints ``marker i`` on a line of its own when it passes; no
    test stops the others. Setup code from a string of tests goes between them as written.
    """
    lines = ["module Solution = struct", with_preamble(source, preamble), "end", "",
             _reexport(preamble.strip()), f"let {name} = Solution.{name}", ""]
    number = 0
    for item in test_items(tests):
        if isinstance(item, Test):
            lines.append(f"let () = match ({item.expression}) with {item.pattern} -> "
                         f"print_string \"\\n{marker} {number}\\n\"; flush stdout | exception _ -> ()")
            number += 1
        else:
            lines.append(item + "\n;;")
    return "\n".join(lines) + "\n"


def _first_error(text: str, max_lines: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("File ")), 0)
    return "\n".join(lines[start:start + max_lines])


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


def grade(completion, problem: dict, config: GradeConfig = DEFAULT, finish_reason: str | None = None) -> Grade:
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
                stage = "passed" if passed == total else "tests"
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


def default_workers() -> int:
    # A grade mostly waits (process start-up, ocamlc, the program), outside Python:
    # twice as many threads as cores kept the 2-core test machine busy.
    return max(1, min(8, 2 * (os.cpu_count() or 1)))


def grade_many(completions: list, problems: list[dict], config: GradeConfig = DEFAULT,
               finish_reasons: list | None = None, workers: int | None = None) -> list[Grade]:
    """Grade completions[i] against problems[i] on a pool of worker threads, in order."""
    reasons = finish_reasons if finish_reasons is not None else [None] * len(completions)
    require_toolchain()
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        return list(pool.map(lambda args: grade(args[0], args[1], config, args[2]),
                             zip(completions, problems, reasons)))


# ---------------------------------------------------------------------------
# Reward functions (fn(prompts, completions, **columns))

# Grades of recent completions, so the logging rewards below do not grade twice.
_recent: OrderedDict = OrderedDict()
_recent_lock = threading.Lock()
_RECENT_MAX = 4096


def _problems(n: int, signature, tests, preamble) -> list[dict]:
    preamble = preamble if preamble is not None else [""] * n
    return [{"signature": s, "tests": t, "preamble": p or ""} for s, t, p in zip(signature, tests, preamble)]


def _key(completion, problem: dict, config: GradeConfig, finish_reason) -> tuple:
    return (completion_text(completion), problem["signature"], tests_key(problem["tests"]), problem["preamble"],
            id(config), finish_reason)


def grades_for(completions: list, signature: list, tests: list, preamble: list | None = None,
               finish_reason: list | None = None, config: GradeConfig = TRAINING) -> list[Grade]:
    """Grades of a batch of completions, graded in parallel once and remembered for a while."""
    problems = _problems(len(completions), signature, tests, preamble)
    reasons = finish_reason if finish_reason is not None else [None] * len(completions)
    keys = [_key(c, p, config, r) for c, p, r in zip(completions, problems, reasons)]
    with _recent_lock:
        known = {k: _recent[k] for k in keys if k in _recent}
    todo = [i for i, k in enumerate(keys) if k not in known]
    if todo:
        fresh = grade_many([completions[i] for i in todo], [problems[i] for i in todo], config,
                           [reasons[i] for i in todo])
        with _recent_lock:
            for i, g in zip(todo, fresh):
                known[keys[i]] = _recent[keys[i]] = g
            while len(_recent) > _RECENT_MAX:
                _recent.popitem(last=False)
    return [known[k] for k in keys]


def make_reward(config: GradeConfig, name: str = "ocaml_reward"):
    """A reward function grading with ``config`` (e.g. other stage weights), for --reward-file."""
    def reward(prompts, completions, signature, tests, preamble=None, finish_reason=None, **kwargs):
        return [g.score for g in grades_for(completions, signature, tests, preamble, finish_reason, config)]

    reward.__name__ = name
    return reward


ocaml_reward = make_reward(TRAINING)
ocaml_reward.__doc__ = "The staged OCaml score (0-1), times 0.3 for degenerate repetitive output."


def ocaml_passes(prompts, completions, signature, tests, preamble=None, **kwargs) -> list[float]:
    """1.0 when every test passes (no penalty), else 0.0: the task's accuracy."""
    return [1.0 if g.stage == "passed" else 0.0
            for g in grades_for(completions, signature, tests, preamble, None, TRAINING)]


def ocaml_compiles(prompts, completions, signature, tests, preamble=None, finish_reason=None, **kwargs):
    """Logged only (weight 0): 1.0 when the code builds with the tests."""
    return [1.0 if g.stage in ("tests", "passed") else 0.0
            for g in grades_for(completions, signature, tests, preamble, finish_reason, TRAINING)]


def ocaml_runaway(prompts, completions, signature, tests, preamble=None, finish_reason=None, **kwargs):
    """Logged only (weight 0): 1.0 when the runaway penalty applied."""
    return [1.0 if g.runaway else 0.0
            for g in grades_for(completions, signature, tests, preamble, finish_reason, TRAINING)]


accuracy_reward = ocaml_passes

# The weight-0 rewards put the compile rate and the runaway rate into the
# metrics (reward/ocaml_compiles/mean, ...) without changing the reward.
REWARDS = [(ocaml_reward, 1.0), (ocaml_compiles, 0.0), (ocaml_runaway, 0.0)]


# ---------------------------------------------------------------------------
# Data


def format_prompt(problem: dict, compact: bool = False) -> str:
    """The prompt: description, then the definition to complete in a code block.

    ``compact``: the definition alone, for the embedded tiny model, whose
    256-token context cannot hold a description (it knows no OCaml anyway; the
    task runs on it only to check the wiring).
    """
    preamble = (problem.get("preamble") or "").strip()
    definition = f"{preamble}\n\n{problem['signature']}" if preamble else problem["signature"]
    if compact:
        return definition
    return (f"{problem['prompt'].strip()}\n\nWrite it in OCaml by completing this definition:\n\n"
            f"```ocaml\n{definition}\n```\n\n"
            "Answer with the complete definition, starting with `let`, in one ```ocaml code block.")


def to_row(record: dict, where: str, compact: bool = False) -> dict:
    """A task row from a problem record; ValueError names ``where``."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object")
    for key in ("prompt", "signature"):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise ValueError(f"{where}: no {key!r} text")
    tests = record.get("tests")
    if test_error(tests):
        raise ValueError(f"{where}: problem {str(record.get('id', '?'))!r}: {test_error(tests)}")
    try:
        function_name(record["signature"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return {
        "prompt": format_prompt(record, compact),
        "id": str(record.get("id", where)),
        "difficulty": str(record.get("difficulty", "")),
        "signature": record["signature"],
        "preamble": record.get("preamble") or "",
        "tests": tests,
    }


def read_problems(path: str | Path) -> list[dict]:
    """Problem records from a JSONL file."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{number}: malformed JSON ({e.msg})") from None
    return records


def problems(split: str) -> list[dict]:
    """The shipped problems of a split ("train" or "test"), with their reference solutions."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    return read_problems(DATA_DIR / f"{split}.jsonl")


def load_rows(split: str, config) -> list[dict]:
    """Rows of ``split``: {"prompt", "id", "difficulty", "signature", "preamble", "tests"}.

    config.data: None (the shipped problems), a folder with train.jsonl and
    test.jsonl, or one JSONL file (its last 10%, at most eval_num_problems, are
    the test split), each line a problem record as in ``rewards/ocaml_data``.
    """
    require_toolchain()
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    data = getattr(config, "data", None)
    if not data:
        path, records = DATA_DIR / f"{split}.jsonl", problems(split)
    else:
        path = Path(data).expanduser()
        if path.is_dir():
            path = path / f"{split}.jsonl"
            if not path.is_file():
                raise ValueError(f"{path.parent}: no {split}.jsonl in this folder")
            records = read_problems(path)
        elif path.is_file():
            records = read_problems(path)
            held_out = min(int(getattr(config, "eval_num_problems", 200)), len(records) // 10)
            records = records[len(records) - held_out:] if split == "test" else records[:len(records) - held_out]
        else:
            raise ValueError(f"data not found: {data}")
    compact = getattr(config, "model", None) is None  # the embedded tiny model: see format_prompt
    return [to_row(r, f"{path}:{i + 1}", compact) for i, r in enumerate(records)]


def recommended_settings(model: str | None) -> dict:
    """Below the YAML file and typed flags.

    A function with a code fence takes 60-250 tokens from a 0.5B instruct model;
    384 leaves room, and longer completions are nearly always runaways. Seed
    001 found 0.8 kept enough spread within groups. Nothing for the embedded
    tiny model, which knows no OCaml (the task runs on it, to check the wiring).
    """
    if model is None:
        return {}
    return {"max_tokens": 384, "temperature": 0.8}
