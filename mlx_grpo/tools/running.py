"""Tools from a Python file, run with a time limit per call; every failure becomes the tool's result text.

`--tools FILE.py`: the file's public functions (not starting with "_", defined
in the file itself rather than imported into it) are the tools, in the order
they are written. A call runs in a worker thread so that a slow or hung tool
costs at most `timeout` seconds; async functions run on their own event
loop there. The calls of one turn run concurrently.

A hung tool's thread cannot be killed from Python: it is left running (as a
daemon, so it never holds the process open) and the model is told the call
timed out.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import threading
import time
from pathlib import Path
from typing import Callable

from .calls import ToolCall, check_call
from .schema import schema_of

DEFAULT_TIMEOUT = 10.0  # seconds a tool call may take


class ToolsFileError(ValueError):
    """A --tools file that cannot be used, in one line."""


def load_tools(path: str | Path) -> dict[str, Callable]:
    """{name: function} of the public functions defined in a Python file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ToolsFileError(f"--tools {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"mlx_grpo_tools_{abs(hash(str(path.resolve())))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - whatever the user's file raises, said in one line
        raise ToolsFileError(f"--tools {path}: importing it raised {type(e).__name__}: {e}") from None
    tools = {
        name: fn
        for name, fn in vars(module).items()
        if not name.startswith("_") and inspect.isfunction(fn) and fn.__module__ == module.__name__
    }
    if not tools:
        raise ToolsFileError(
            f"--tools {path}: it defines no public function (a tool is a function whose name "
            "does not start with _)"
        )
    for fn in tools.values():
        try:
            schema_of(fn)
        except ValueError as e:
            raise ToolsFileError(f"--tools {path}: {e}") from None
    return dict(sorted(tools.items(), key=lambda item: item[1].__code__.co_firstlineno))


def schemas_of(tools: dict[str, Callable]) -> dict[str, dict]:
    return {name: schema_of(fn) for name, fn in tools.items()}


def result_text(value) -> str:
    """What the model reads back: strings as they are, anything else as JSON (or its repr)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _call(fn: Callable, arguments: dict):
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(**arguments))
    value = fn(**arguments)
    if inspect.isawaitable(value):
        return asyncio.run(value)
    return value


def run_calls(
    calls: list[ToolCall], tools: dict[str, Callable], timeout: float = DEFAULT_TIMEOUT
) -> list[tuple[str, str | None]]:
    """(result text, error kind or None) of each call, run concurrently. Error kinds: "parse" (the
    call could not be read), "invalid" (an unknown tool or bad arguments), "raised", "timeout"."""
    schemas = schemas_of(tools)
    outcomes: list[dict] = [{} for _ in calls]  # each worker writes only its own dict
    threads = []
    for call, outcome in zip(calls, outcomes):
        if call.error is not None:
            outcome["result"] = (f"Error: {call.error}", "parse")
            continue
        checked = check_call(call, schemas)
        if checked.error is not None:
            outcome["result"] = (f"Error: {checked.error}", "invalid")
            continue

        def work(call=call, outcome=outcome):
            try:
                outcome["result"] = (result_text(_call(tools[call.name], call.arguments)), None)
            except Exception as e:  # noqa: BLE001 - the tool's failure is the model's to read
                outcome["result"] = (f"Error: {call.name} raised {type(e).__name__}: {e}", "raised")

        thread = threading.Thread(target=work, daemon=True, name=f"tool-{call.name}")
        thread.start()
        threads.append((call, outcome, thread))
    deadline = time.monotonic() + timeout  # all run at once: the turn waits about `timeout` at most
    results = []
    for call, outcome in zip(calls, outcomes):
        for c, o, thread in threads:
            if o is outcome:
                thread.join(max(0.0, deadline - time.monotonic()))
        done = outcome.get("result")  # read once: a late finish after this does not change the answer
        results.append(
            done if done is not None else (f"Error: {call.name} timed out after {timeout:g} s", "timeout")
        )
    return results
