"""A problem's tests: a list of OCaml ``assert`` expressions, or one string of OCaml test code.

A list holds n tests, one expression each. A string is a block of top-level
OCaml, as one would write it below the function::

    let check xs n = assert (sum_list xs = n)
    let () =
      assert (sum_list [] = 0);
      check [1; 2] 3

It is cut into top-level phrases, and each phrase that only runs code
(``let () = ...``, ``let _ = ...``, ``let _name = ...``, or a bare expression)
is a test; one whose body is a sequence of plain ``assert GROUP`` statements is
one test per assert. Every other phrase (functions, types, values the tests
share) stays as it is, between the tests, in its place. When code other than
tests follows the last test, reaching the end of the program is one more test,
so a failure there still counts; a block with no test phrase is therefore one
test, all or nothing. A phrase that raises ends the program, failing every test
after it, so a run passes every test only when the whole block would run.

The cutting follows OCaml's grammar without a full parser: a new top-level
phrase starts at ``;;`` or at a structure keyword (``let``, ``type``, ...) right
after a token that ends an expression, since an expression can only be followed
by such a keyword when it is complete (``f let x = ...`` does not parse). A
body is only split at ``;`` when every piece is ``assert`` and one group, and
then nothing can stretch over the ``;``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Test:
    """One test: an expression that passes when it evaluates, without raising, to ``pattern``."""

    expression: str
    pattern: str = "()"


def test_error(tests) -> str | None:
    """Why ``tests`` cannot be graded (None when it can): a list of strings or a string of code."""
    if isinstance(tests, str):
        return None if _tokens(tests) else "'tests' is a string with no OCaml code in it"
    if isinstance(tests, list) and tests and all(isinstance(t, str) and t.strip() for t in tests):
        return None
    return (
        "'tests' must be a non-empty list of OCaml assert expressions or a string of OCaml test "
        f"code, not {_describe(tests)}"
    )


def _describe(value) -> str:
    """``value`` as its JSON type, for the messages above."""
    if isinstance(value, list):
        bad = [v for v in value if not isinstance(v, str) or not v.strip()]
        return "an empty list" if not value else f"a list holding {_describe(bad[0])}"
    if isinstance(value, str):
        return "an empty string"
    names = {bool: "a boolean", int: "a number", float: "a number", dict: "an object", type(None): "null"}
    return names.get(type(value), f"a {type(value).__name__}")


def check_tests(tests) -> None:
    """A ValueError saying what is wrong when ``tests`` cannot be graded."""
    error = test_error(tests)
    if error:
        raise ValueError(error)


def test_items(tests) -> tuple:
    """Setup code (str, verbatim) and tests (Test), in program order, from a list of
    expressions or a string of test code."""
    check_tests(tests)
    if isinstance(tests, str):
        return _split_block(tests)
    return tuple(Test(t) for t in tests)


def count_tests(tests) -> int:
    return sum(isinstance(item, Test) for item in test_items(tests))


def tests_key(tests):
    """A hashable stand-in for ``tests`` (a list or a string)."""
    check_tests(tests)
    return tests if isinstance(tests, str) else tuple(tests)


# ---------------------------------------------------------------------------
# Tokens: enough of OCaml's lexer to skip comments, strings and characters.

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_']*")
_NUMBER = re.compile(r"[0-9][0-9A-Za-z_]*(?:\.[0-9_]*)?(?:[eEpP][+-]?[0-9_]+)?")
_CHAR = re.compile(
    r"'(?:\\(?:[\\'\"ntbr ]|[0-9]{3}|x[0-9A-Fa-f]{2}|o[0-3][0-7]{2}|u\{[0-9A-Fa-f]+\})|[^\\'\n])'"
)
_QUOTED = re.compile(r"\{([a-z_]*)\|")
_SYMBOLS = re.compile(r"[!$%&*+\-./:<=>?@^|~#,`']+")
_OPENING = {"(", "[", "[|", "{", "begin", "struct", "sig", "object", "do"}
_CLOSING = {")", "]", "|]", "}", "end", "done"}
_KEYWORDS = set(
    """and as assert begin class constraint do downto else exception external for fun function
    functor if in include inherit initializer lazy let match method module mutable new nonrec object of open
    or private rec sig struct then to try type val virtual when while with""".split()
)
_PHRASE_START = {"let", "type", "open", "module", "exception", "external", "include", "class"}


@dataclass(frozen=True)
class _Token:
    text: str
    start: int
    end: int
    kind: str  # "word", "value" (literal), "symbol"


def _skip_comment(text: str, i: int) -> int:
    """The index after the comment opening at ``i``. Comments nest, and as in OCaml the
    strings and characters inside them count (``(* "*)" *)`` is one comment, ``'"'`` no string)."""
    depth = 0
    while i < len(text):
        if text.startswith("(*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*)", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        elif text[i] == '"':
            i = _skip_string(text, i)
        elif literal := _CHAR.match(text, i) or _QUOTED.match(text, i):
            i = _skip_quoted(text, literal) if literal.re is _QUOTED else literal.end()
        else:
            i += 1
    return i


def _skip_string(text: str, i: int) -> int:
    i += 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _skip_quoted(text: str, opening: re.Match) -> int:
    """The index after a quoted string ``{id|...|id}`` whose opening ``opening`` matched."""
    close = text.find("|" + opening.group(1) + "}", opening.end())
    return len(text) if close < 0 else close + len(opening.group(1)) + 2


@lru_cache(maxsize=1024)
def _tokens(text: str) -> tuple:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if text.startswith("(*", i):
            i = _skip_comment(text, i)
            continue
        start = i
        if c == '"':
            i, kind = _skip_string(text, i), "value"
        elif quoted := _QUOTED.match(text, i):
            i, kind = _skip_quoted(text, quoted), "value"
        elif (m := _CHAR.match(text, i)) or (m := _NUMBER.match(text, i)):
            i, kind = m.end(), "value"
        elif m := _IDENT.match(text, i):
            i, kind = m.end(), "word"
        elif text.startswith(("[|", "|]", ";;"), i):
            i, kind = i + 2, "symbol"
        elif c in "()[]{};":
            i, kind = i + 1, "symbol"
        else:
            m = _SYMBOLS.match(text, i)
            i, kind = (m.end() if m else i + 1), "symbol"
        out.append(_Token(text[start:i], start, i, kind))
    return tuple(out)


def _ends_expression(token: _Token | None) -> bool:
    if token is None:
        return False
    if token.kind == "value" or token.text in (")", "]", "|]", "}", "end", "done"):
        return True
    return token.kind == "word" and token.text not in _KEYWORDS


# ---------------------------------------------------------------------------
# Phrases and tests


def _phrases(tokens: tuple) -> list[list[_Token]]:
    """Top-level phrases: cut at ``;;`` and at a structure keyword that follows a complete expression."""
    phrases, current, depth, previous = [], [], 0, None
    for token in tokens:
        if depth == 0 and token.text == ";;":
            phrases.append(current)
            current, previous = [], None
            continue
        if depth == 0 and token.text in _PHRASE_START and _ends_expression(previous):
            phrases.append(current)
            current = []
        if token.text in _OPENING:
            depth += 1
        elif token.text in _CLOSING:
            depth = max(depth - 1, 0)
        current.append(token)
        previous = token
    phrases.append(current)
    return [p for p in phrases if p]


def _statements(tokens: list[_Token]) -> list[list[_Token]]:
    """``tokens`` cut at the ``;`` outside any brackets (a trailing ``;`` gives nothing)."""
    pieces, current, depth = [], [], 0
    for token in tokens:
        if token.text in _OPENING:
            depth += 1
        elif token.text in _CLOSING:
            depth -= 1
        if depth == 0 and token.text == ";":
            pieces.append(current)
            current = []
        else:
            current.append(token)
    pieces.append(current)
    return [p for p in pieces if p]


def _is_one_assert(piece: list[_Token]) -> bool:
    """``assert`` then exactly one group: ``(...)``, ``begin ... end`` or a single name or literal."""
    if len(piece) < 2 or piece[0].text != "assert":
        return False
    if len(piece) == 2:
        return piece[1].kind in ("word", "value") and piece[1].text not in _KEYWORDS
    if piece[1].text not in ("(", "begin"):
        return False
    depth = 0
    for k, token in enumerate(piece[1:], start=1):
        if token.text in _OPENING:
            depth += 1
        elif token.text in _CLOSING:
            depth -= 1
            if depth == 0:
                return k == len(piece) - 1
    return False


def _test_body(phrase: list[_Token]) -> tuple[str, int] | None:
    """(pattern, index of the body's first token) for a phrase that only runs code, else None."""
    if phrase[0].text != "let":
        return ("_", 0) if phrase[0].text not in _PHRASE_START else None
    heads = [t.text for t in phrase[1:4]]
    if heads == ["(", ")", "="] and len(phrase) > 4:
        found = "()", 4
    elif len(heads) >= 2 and heads[1] == "=" and heads[0].startswith("_") and len(phrase) > 3:
        found = "_", 3
    else:
        return None
    # `let () = ... and () = ...` binds twice: not one expression (an `and` of a
    # `let ... in` inside looks the same; such a phrase is kept as setup too).
    depth = 0
    for token in phrase[found[1] :]:
        depth += (token.text in _OPENING) - (token.text in _CLOSING)
        if depth == 0 and token.text == "and":
            return None
    return found


@lru_cache(maxsize=1024)
def _split_block(text: str) -> tuple:
    items: list = []
    for phrase in _phrases(_tokens(text)):
        source = text[phrase[0].start : phrase[-1].end]
        found = _test_body(phrase)
        if found is None:
            items.append(source)
            continue
        pattern, first = found
        body = phrase[first:]
        while body[-1].text == ";" and len(body) > 1:  # a trailing `;` ends the sequence
            body = body[:-1]
        pieces = _statements(body)
        if len(pieces) > 1 and all(_is_one_assert(p) for p in pieces):
            items += [Test(text[p[0].start : p[-1].end], "()") for p in pieces]
        else:
            items.append(Test(text[body[0].start : body[-1].end], pattern))
    if not items or not isinstance(items[-1], Test):
        items.append(Test("()"))  # reaching the end of the program: see the module's docstring
    return tuple(items)
