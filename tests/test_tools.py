"""Tools as plain functions: schemas from signatures, calls parsed in three styles, run with time limits."""

import asyncio
import time
from typing import Literal, Optional

import pytest

from mlx_grpo.tools import (
    ToolSchemaError,
    ToolsFileError,
    check_call,
    load_tools,
    parse_calls,
    run_calls,
    schema_of,
    schemas_of,
    style_for_template,
)


def search(
    query: str,
    k: int = 3,
    exact: bool = False,
    fields: Optional[list[str]] = None,
    order: Literal["score", "date"] = "score",
    boost: float | None = None,
):
    """Search the corpus for passages.

    Longer text that is not the summary.

    Args:
        query: what to look for
        k (int): how many passages to return,
            best first
        order: how to sort them
    """


def test_schema_from_signature_hints_and_docstring():
    got = schema_of(search)
    assert got == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the corpus for passages.",
            "parameters": {
                "type": "object",
                "required": ["query"],
                "properties": {
                    "query": {"type": "string", "description": "what to look for"},
                    "k": {"type": "integer", "description": "how many passages to return, best first"},
                    "exact": {"type": "boolean"},
                    "fields": {"type": "array", "items": {"type": "string"}},
                    "order": {"type": "string", "enum": ["score", "date"], "description": "how to sort them"},
                    "boost": {"type": "number"},
                },
            },
        },
    }


def test_schema_reads_param_docstrings_and_refuses_types_without_json():
    def lookup(title, n: int):
        """Read a page.

        :param title: the page's exact title
        :param int n: how many lines
        """

    params = schema_of(lookup)["function"]["parameters"]
    assert params["properties"] == {
        "title": {"description": "the page's exact title"},
        "n": {"type": "integer", "description": "how many lines"},
    }
    assert schema_of(lookup)["function"]["description"] == "Read a page."

    def bad(when: time.struct_time):
        """x"""

    with pytest.raises(ToolSchemaError, match="argument when"):
        schema_of(bad)


def test_hermes_calls_several_broken_and_cut():
    text = (
        'I will search.\n<tool_call>\n{"name": "search", "arguments": {"query": "Oslo", "k": 2}}\n'
        "</tool_call>\n"
        '<tool_call>{"name": "search", "arguments": {"query": "Bergen"</tool_call>\n'
        '<tool_call>{"name": "read", "arguments": "{\\"title\\": \\"Oslo\\"}"}</tool_call>'
        '<tool_call>{"name": "read", "arguments": {"title": "X"}}'
    )  # cut before its end tag
    calls = parse_calls(text, "hermes")
    assert [(c.name, c.arguments, c.error is None) for c in calls] == [
        ("search", {"query": "Oslo", "k": 2}, True),
        (None, {}, False),
        ("read", {"title": "Oslo"}, True),
        ("read", {"title": "X"}, True),
    ]
    assert "not valid JSON" in calls[1].error
    assert parse_calls("The answer is 42.", "hermes") == []
    extra = parse_calls('<tool_call>{"name": "a", "arguments": {}}}</tool_call>', "hermes")[0]
    assert extra.error and "extra text" in extra.error  # vLLM's parser drops these silently


def test_llama3_and_mistral_styles():
    calls = parse_calls(
        '<|python_tag|>{"name": "search", "parameters": {"query": "x"}}; '
        '{"name": "read", "parameters": {"title": "y"}}',
        "llama3",
    )
    assert [(c.name, c.arguments) for c in calls] == [("search", {"query": "x"}), ("read", {"title": "y"})]
    assert parse_calls("Paris is the capital.", "llama3") == []
    assert parse_calls('{"name": "search", "parameters": {"query": ', "llama3")[0].error
    calls = parse_calls(
        '[TOOL_CALLS][{"name": "search", "arguments": {"query": "x"}}, '
        '{"name": "read", "arguments": {"title": "y"}}]',
        "mistral",
    )
    assert [(c.name, c.arguments) for c in calls] == [("search", {"query": "x"}), ("read", {"title": "y"})]
    calls = parse_calls('[TOOL_CALLS]search[ARGS]{"query": "z"}', "mistral")
    assert [(c.name, c.arguments, c.error) for c in calls] == [("search", {"query": "z"}, None)]
    with pytest.raises(ValueError, match="not one of"):
        parse_calls("", "xml")


def test_style_follows_the_template():
    assert style_for_template("{{ '<tool_call>' }}") == "hermes"
    assert style_for_template("[TOOL_CALLS] {{ x }}") == "mistral"
    assert style_for_template("<|start_header_id|>ipython ... parameters") == "llama3"
    assert style_for_template(None) == "hermes"


def test_check_call_names_unknown_tools_and_bad_arguments():
    schemas = schemas_of({"search": search})
    ok = parse_calls('<tool_call>{"name": "search", "arguments": {"query": "a", "k": 2}}</tool_call>')[0]
    assert check_call(ok, schemas).error is None
    cases = {
        '{"name": "find", "arguments": {}}': "unknown tool 'find'",
        '{"name": "search", "arguments": {"q": "a"}}': "no argument 'q'",
        '{"name": "search", "arguments": {"k": 2}}': "needs the argument 'query'",
        '{"name": "search", "arguments": {"query": "a", "k": "2"}}': "must be an integer",
        '{"name": "search", "arguments": {"query": "a", "k": true}}': "must be an integer",
        '{"name": "search", "arguments": {"query": "a", "order": "size"}}': "must be one of",
        '{"name": "search", "arguments": {"query": "a", "fields": ["x", 1]}}': "fields'[1]",
    }
    for body, message in cases.items():
        error = check_call(parse_calls(f"<tool_call>{body}</tool_call>")[0], schemas).error
        assert error and message in error, (body, error)


def test_run_calls_results_errors_timeouts_concurrently():
    def add(a: int, b: int):
        """Add."""
        return {"sum": a + b}

    def boom(x: str):
        """Fails."""
        raise KeyError(x)

    def slow(seconds: float):
        """Sleeps."""
        time.sleep(seconds)
        return "woke"

    async def later(x: str):
        """Async."""
        await asyncio.sleep(0.01)
        return x.upper()

    tools = {"add": add, "boom": boom, "slow": slow, "later": later}
    calls = parse_calls(
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        '<tool_call>{"name": "boom", "arguments": {"x": "k"}}</tool_call>'
        '<tool_call>{"name": "slow", "arguments": {"seconds": 30}}</tool_call>'
        '<tool_call>{"name": "slow", "arguments": {"seconds": 30}}</tool_call>'
        '<tool_call>{"name": "later", "arguments": {"x": "hi"}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": </tool_call>'
    )
    start = time.monotonic()
    results = run_calls(calls, tools, timeout=0.5)
    assert time.monotonic() - start < 1.5  # two hung calls share one time limit
    assert results[0] == ('{"sum": 3}', None)
    assert results[1][1] == "raised" and "KeyError" in results[1][0]
    assert results[2] == results[3] == ("Error: slow timed out after 0.5 s", "timeout")
    assert results[4] == ("HI", None)
    assert results[5][1] == "invalid" and results[6][1] == "parse"


def test_load_tools_takes_the_files_own_public_functions(tmp_path):
    path = tmp_path / "tools.py"
    path.write_text(
        "from os.path import join\n\n"
        "def search(query: str) -> str:\n    '''Search.'''\n    return query\n\n"
        "def _helper():\n    pass\n\n"
        "def read(title: str) -> str:\n    '''Read.'''\n    return title\n"
    )
    assert list(load_tools(path)) == ["search", "read"]
    (tmp_path / "bad.py").write_text("raise RuntimeError('no')\n")
    with pytest.raises(ToolsFileError, match="raised RuntimeError: no"):
        load_tools(tmp_path / "bad.py")
    (tmp_path / "none.py").write_text("X = 1\n")
    with pytest.raises(ToolsFileError, match="no public function"):
        load_tools(tmp_path / "none.py")
    with pytest.raises(ToolsFileError, match="no such file"):
        load_tools(tmp_path / "missing.py")
