"""The task "ocaml": the model writes an OCaml function; a sandboxed compile and test run grades it.

Problems ship in ``rewards/ocaml_data/{train,test}.jsonl``, one JSON object a line:
``id``, ``difficulty``, ``topic``, ``prompt`` (the description), ``signature``
(``let rev_list (xs : int list) : int list =``), ``preamble`` (type definitions the
problem gives, often ""), ``tests`` (a list of OCaml ``assert`` expressions, or one
string of OCaml test code: see ``testcode.py``) and ``solution`` (the
reference). The shipped ones are built from ``rewards/ocaml_data/ocaml_problems.txt`` (every
fifth held out) and ``ocaml_test_problems.txt`` beside it (held out only) by
``scripts/build_ocaml_problems.py``.

Grading (``grade``; ``score`` is its number) goes through stages, each worth more:

    stage           reached when                                   default score
    no_code         nothing to compile                             0.0
    syntax_error    the code does not parse                        0.0
    type_error      parses, fails the type check                   0.1
    compile_error   type-checks alone, fails to build with tests   0.2
    constant        builds, fails a test, uses none of its inputs  0.0
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

The modules, in the order a completion meets them: ``problem_sets`` (the shipped
problems or ``--data``), ``prompts`` (a problem as a prompt and a row), ``testcode``
(a problem's tests), ``source`` (from completion to program), ``grading`` (one
completion: the stages and what each is worth, the toolchain, runaway output),
``pool`` (many completions at once, remembered) and ``reward_functions`` (what the
trainer calls).
"""

from .grading import (
    DEFAULT,
    INSTALL_HINT,
    STAGES,
    TRAINING,
    Grade,
    GradeConfig,
    StageWeights,
    grade,
    is_cut,
    is_repetitive,
    require_toolchain,
    runaway_reason,
    score,
    toolchain_path,
)
from .pool import default_workers, grade_many, grades_for
from .problem_sets import DATA_DIR, load_rows, problems, read_problems, recommended_settings
from .prompts import SYSTEM_PROMPT, format_prompt, reference_answer, to_row
from .reward_functions import (
    REWARDS,
    accuracy_reward,
    answer_stages,
    make_reward,
    ocaml_compiles,
    ocaml_passes,
    ocaml_reward,
    ocaml_runaway,
)
from .source import assemble, extract_code, function_name, program, with_preamble

__all__ = [
    "DATA_DIR",
    "DEFAULT",
    "INSTALL_HINT",
    "REWARDS",
    "STAGES",
    "SYSTEM_PROMPT",
    "TRAINING",
    "Grade",
    "GradeConfig",
    "StageWeights",
    "accuracy_reward",
    "answer_stages",
    "assemble",
    "default_workers",
    "extract_code",
    "format_prompt",
    "function_name",
    "grade",
    "grade_many",
    "grades_for",
    "is_cut",
    "is_repetitive",
    "load_rows",
    "make_reward",
    "ocaml_compiles",
    "ocaml_passes",
    "ocaml_reward",
    "ocaml_runaway",
    "problems",
    "program",
    "read_problems",
    "recommended_settings",
    "reference_answer",
    "require_toolchain",
    "runaway_reason",
    "score",
    "to_row",
    "toolchain_path",
    "with_preamble",
]
