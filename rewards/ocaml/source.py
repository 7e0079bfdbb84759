"""From a completion to a program: the code, joined with the signature, the types and the tests."""

from __future__ import annotations

import re

from .testcode import Test, test_items

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
    head = (
        signature if re.match(r"\s*let\s+rec\b", signature) else re.sub(r"^\s*let\b", "let rec", signature, 1)
    )
    return head + "\n" + "\n".join("  " + line for line in code.splitlines())


_IDENT = r"[a-z_][A-Za-z0-9_']*"


def ignores_its_input(source: str, name: str) -> bool:
    """Whether the definition of ``name`` in ``source`` (as ``assemble`` makes it) names none of its
    parameters after its header: it returns a constant, whatever it is given.

    No problem's tests accept a constant (tests/test_ocaml_data.py checks that constants of the return
    type fail one), so such a program earns no credit for the tests it passes by luck. Qwen2.5-Coder-0.5B
    learned exactly that in 18 steps (``let fib (n : int) : int = 0`` passes ``fib 0 = 0``: 0.44,
    against 0.1 for a real attempt that failed the type check; docs/real-models.md). A header with no
    named parameter (``let f = function ...``) is not judged.
    """
    match = re.search(rf"\b(?:let|and)\s+(?:rec\s+)?{re.escape(name)}\b([^=]*)=", source)
    if not match:
        return False
    header = match.group(1)
    annotated = re.findall(rf"[~?]?\(\s*({_IDENT})\s*:", header)
    bare = re.sub(r"\([^()]*\)", " ", header).split(":")[0]  # annotated groups out, then the return type
    names = set(annotated) | {w.lstrip("~?") for w in bare.split() if re.fullmatch(rf"[~?]?{_IDENT}", w)}
    names.discard("_")
    if not names:
        return False
    body = source[match.end() :]
    return not any(re.search(rf"(?<![\w']){re.escape(n)}(?![\w'])", body) for n in names)


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
        out.append(preamble[last : m.start()])
        rest = preamble[m.end() : m.end() + 1]
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
    lines = [
        "module Solution = struct",
        with_preamble(source, preamble),
        "end",
        "",
        _reexport(preamble.strip()),
        f"let {name} = Solution.{name}",
        "",
    ]
    number = 0
    for item in test_items(tests):
        if isinstance(item, Test):
            lines.append(
                f"let () = match ({item.expression}) with {item.pattern} -> "
                f'print_string "\\n{marker} {number}\\n"; flush stdout | exception _ -> ()'
            )
            number += 1
        else:
            lines.append(item + "\n;;")
    return "\n".join(lines) + "\n"
