"""The task's prompts: the system prompt, and a problem record as a row the trainer uses."""

from __future__ import annotations

from .source import function_name
from .testcode import test_error

SYSTEM_PROMPT = (
    "You are an expert OCaml programmer. Answer with the complete OCaml definition "
    "in a single ```ocaml code block, and nothing else."
)


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
    return (
        f"{problem['prompt'].strip()}\n\nWrite it in OCaml by completing this definition:\n\n"
        f"```ocaml\n{definition}\n```\n\n"
        "Answer with the complete definition, starting with `let`, in one ```ocaml code block."
    )


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
    row = {
        "prompt": format_prompt(record, compact),
        "id": str(record.get("id", where)),
        "difficulty": str(record.get("difficulty", "")),
        "signature": record["signature"],
        "preamble": record.get("preamble") or "",
        "tests": tests,
    }
    if isinstance(record.get("solution"), str) and record["solution"].strip():
        row["solution"] = record["solution"]
    return row


def reference_answer(row: dict) -> str | None:
    """The row's reference solution as the system prompt asks for an answer (--guide): one ```ocaml block."""
    solution = row.get("solution")
    if not isinstance(solution, str) or not solution.strip():
        return None
    return f"```ocaml\n{solution.strip()}\n```"
