"""The held-out OCaml problems: enough of them, none from train, and tests that can fail.

Every test-split problem's reference passes all of its asserts, and wrong answers fail at least
one: (a) a constant of the return type and (b) an argument returned unchanged where its type
is the return type. Both are derived from the signature and the preamble's types, so a new
problem is covered without a hand-written case. Return types with no constant: a bare type
variable (``'a``: no value has every type) and a function type; such a problem needs (b), and
none of the shipped ones lacks it (NO_WRONG_ANSWER lists the exceptions: none).
Every answer is graded the way the trainer grades (``ocaml.grade_many``), in one batch.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from marks import needs_ocaml
from rewards import ocaml

ROOT = Path(__file__).resolve().parents[1]
TRAIN, TEST = ocaml.problems("train"), ocaml.problems("validation") + ocaml.problems("test")  # the test file
ALL = TRAIN + TEST
NO_WRONG_ANSWER: dict[str, str] = {}  # id -> why neither a constant nor an argument can be returned


# ---------------------------------------------------------------------------
# Types: from a signature and a preamble to constants


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` cut at ``sep`` outside brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i = i + len(sep)
            continue
        i += 1
    return [p.strip() for p in parts + [text[start:]]]


def _closing(text: str, start: int) -> int:
    """The index of the bracket that closes the one at ``start`` (-1 if none)."""
    depth = 0
    for i in range(start, len(text)):
        depth += (text[i] == "(") - (text[i] == ")")
        if depth == 0:
            return i
    return -1


def _unwrap(text: str) -> str:
    """``text`` without brackets around all of it."""
    text = text.strip()
    while text.startswith("(") and _closing(text, 0) == len(text) - 1:
        text = text[1:-1].strip()
    return text


def parse_signature(signature: str) -> tuple[list[tuple[str, str]], str]:
    """([(parameter, type)], return type) of ``let f (x : t) ... : r =``; every parameter annotated."""
    rest = re.match(r"\s*let\s+(?:rec\s+)?[a-z_][\w']*\s*(.*)=\s*$", signature, re.S)[1]
    parameters = []
    while rest.startswith("("):
        end = _closing(rest, 0)
        name, _, annotation = rest[1:end].partition(":")
        if not annotation or not re.fullmatch(r"[a-z_][\w']*", name.strip()):
            raise ValueError(f"not an annotated parameter: ({rest[1:end]}) in {signature!r}")
        parameters.append((name.strip(), " ".join(annotation.split())))
        rest = rest[end + 1 :].lstrip()
    if not rest.startswith(":"):
        raise ValueError(f"no return type in {signature!r}")
    return parameters, " ".join(rest[1:].split())


def parse_types(preamble: str) -> dict[str, tuple[str, list]]:
    """The preamble's types: name -> ("record", [(field, type)]) or ("variant", [(constructor, type or
    None)])."""
    types = {}
    for definition in re.split(r"\btype\b|\band\b", preamble)[1:]:
        head, _, body = definition.partition("=")
        name, body = head.split()[-1], " ".join(body.split())
        if body.startswith("{"):
            fields = [f.partition(":") for f in _split_top(body.strip("{} "), ";") if f]
            types[name] = ("record", [(f.strip(), t.strip()) for f, _, t in fields])
        else:
            cases = [c.partition(" of ") for c in _split_top(body.lstrip("| "), "|")]
            types[name] = ("variant", [(c.strip(), t.strip() or None) for c, _, t in cases])
    return types


SCALARS = {
    "int": ["0"],
    "float": ["0."],
    "bool": ["false", "true"],
    "string": ['""'],
    "char": ["'x'"],
    "unit": ["()"],
}


def constants(type_: str, types: dict) -> list[str]:
    """OCaml constants of ``type_``, the simplest first; [] when there are none (a type variable, a
    function)."""
    type_ = _unwrap(type_)
    if _split_top(type_, "->")[1:]:
        return []
    if len(parts := _split_top(type_, "*")) > 1:
        firsts = [constants(p, types)[:1] for p in parts]
        return [f"({', '.join(f[0] for f in firsts)})"] if all(firsts) else []
    words = type_.rsplit(None, 1)
    argument, head = (words[0], words[1]) if len(words) == 2 else ("", words[0])
    if head in SCALARS:
        return SCALARS[head]
    if head in ("list", "array"):
        return ["[]" if head == "list" else "[||]"]
    if head == "option":
        return ["None"] + [f"Some ({c})" for c in constants(argument, types)[:1]]
    if head in types:
        kind, members = types[head]
        if kind == "record":
            values = [constants(t, types)[:1] for _, t in members]
            return (
                ["{ " + "; ".join(f"{f} = {v[0]}" for (f, _), v in zip(members, values)) + " }"]
                if all(values)
                else []
            )
        nullary = [c for c, t in members if t is None]
        if nullary:
            return nullary
        for constructor, arguments in members:  # no constant constructor: the first one that can be built
            if built := constants(arguments, types):
                return [f"{constructor} {built[0] if built[0].startswith('(') else f'({built[0]})'}"]
    return []  # a type variable ('a), or a type the preamble does not define


def wrong_answers(problem: dict) -> list[tuple[str, str]]:
    """(what, code) for each wrong answer of ``problem``: constants of the return type, then
    every parameter of the return type returned unchanged."""
    parameters, result = parse_signature(problem["signature"])
    types = parse_types(problem.get("preamble") or "")
    signature = problem["signature"].strip()
    answers = [(f"the constant {c}", f"{signature}\n  {c}") for c in constants(result, types)]
    answers += [
        (f"the argument {name} unchanged", f"{signature}\n  {name}")
        for name, type_ in parameters
        if type_ == result
    ]
    return answers


def test_wrong_answers_come_from_the_signature():
    """Hand-worked derivations, one per kind of type."""
    assert parse_signature("let pop (q : queue) : (int * queue) option =") == (
        [("q", "queue")],
        "(int * queue) option",
    )
    assert parse_signature("let f (g : 'a -> 'b) (xs : 'a list) : 'b list =") == (
        [("g", "'a -> 'b"), ("xs", "'a list")],
        "'b list",
    )
    queue = parse_types("type queue = { front : int list; back : int list }")
    assert constants("(int * queue) option", queue) == ["None", "Some ((0, { front = []; back = [] }))"]
    light = parse_types("type light = Red | Green | Yellow")
    assert constants("light", light) == ["Red", "Green", "Yellow"]
    tree = parse_types("type 'a tree = Leaf | Node of 'a tree * 'a * 'a tree")
    assert constants("int tree", tree) == ["Leaf"]
    boxed = parse_types("type box = Box of int * string")
    assert constants("box", boxed) == ['Box (0, "")']
    assert constants("bool", {}) == ["false", "true"] and constants("int list list", {}) == ["[]"]
    assert (
        constants("'a", {}) == []
        and constants("int -> int", {}) == []
        and constants("'a option", {}) == ["None"]
    )
    fold = {
        "signature": "let my_fold_left (f : 'a -> 'b -> 'a) (acc : 'a) (xs : 'b list) : 'a =",
        "preamble": "",
    }
    assert wrong_answers(fold) == [("the argument acc unchanged", fold["signature"] + "\n  acc")]


# ---------------------------------------------------------------------------
# The split (no toolchain needed)


def _name(problem: dict) -> str:
    return ocaml.function_name(problem["signature"])


def test_the_test_split_is_large_enough_and_mixed_like_train():
    assert len(TEST) >= 100
    for key in ("difficulty", "topic"):
        test, train = Counter(p[key] for p in TEST), Counter(p[key] for p in TRAIN)
        assert set(test) == set(train), key
        for value, n in test.items():  # each difficulty's and topic's share within 5 points of train's
            assert abs(n / len(TEST) - train[value] / len(TRAIN)) < 0.05, (key, value)


def test_problem_set_shape():
    assert len(ALL) >= 80
    assert len(TEST) >= 15
    ids = [p["id"] for p in ALL]
    assert len(set(ids)) == len(ids)
    assert not {p["id"] for p in TRAIN} & {p["id"] for p in TEST}
    assert {p["difficulty"] for p in ALL} == {"easy", "medium", "hard"}
    assert {p["difficulty"] for p in TEST} == {"easy", "medium", "hard"}
    topics = {p["topic"] for p in ALL}
    assert {"lists", "strings", "recursion", "options", "records", "higher-order", "algorithms"} <= topics
    for p in ALL:
        assert set(p) >= {"id", "difficulty", "prompt", "signature", "tests", "solution"}
        assert len(p["tests"]) >= 4 and all(t.startswith("assert (") for t in p["tests"])
        assert re.match(r"let [a-z_]\w* .*=$", p["signature"])


def test_shipped_files_match_their_source():
    """rewards/ocaml_data's JSONL files are what scripts/build_ocaml_problems.py makes of the sources beside
    them, ocaml_problems.txt and ocaml_test_problems.txt (test split only)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_ocaml", ROOT / "scripts" / "build_ocaml_problems.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    train, test = build.load()
    assert train == TRAIN and test == TEST


def test_no_test_problem_repeats_a_train_problem_or_another_test_problem():
    for key in (lambda p: p["id"], _name, lambda p: " ".join(p["prompt"].lower().split())):
        train, test = [key(p) for p in TRAIN], [key(p) for p in TEST]
        assert not set(train) & set(test)
        assert len(set(test)) == len(test), [k for k, n in Counter(test).items() if n > 1]


def test_every_test_problem_has_a_wrong_answer_to_check():
    missing = {p["id"] for p in TEST if not wrong_answers(p)}
    assert missing == set(NO_WRONG_ANSWER)
    for p in TEST:
        assert 4 <= len(p["tests"]) <= 6, p["id"]


# ---------------------------------------------------------------------------
# Grading every answer (needs the toolchain)


@pytest.fixture(scope="module")
def graded():
    """{id: (reference's grade, [(what, grade)])}, every answer graded in one batch."""
    jobs = []
    for p in TEST:
        jobs.append((p, "reference", p["solution"]))
        jobs += [(p, what, code) for what, code in wrong_answers(p)]
    grades = ocaml.grade_many([f"```ocaml\n{code}\n```" for _, _, code in jobs], [p for p, _, _ in jobs])
    out = {p["id"]: [None, []] for p in TEST}
    for (p, what, _), g in zip(jobs, grades):
        if what == "reference":
            out[p["id"]][0] = g
        else:
            out[p["id"]][1].append((what, g))
    return out


@needs_ocaml
def test_every_reference_passes_every_assert(graded):
    failures = {
        pid: (g.stage, g.tests_passed, g.tests_total, g.error)
        for pid, (g, _) in graded.items()
        if g.stage != "passed" or g.tests_passed != g.tests_total
    }
    assert failures == {}


@needs_ocaml
def test_every_wrong_answer_builds_and_fails_an_assert(graded):
    did_not_build = {
        (pid, what): g.error
        for pid, (_, wrong) in graded.items()
        for what, g in wrong
        if g.stage not in ("constant", "tests", "passed")
    }
    assert did_not_build == {}  # a wrong answer that does not build checks nothing
    passed = [(pid, what) for pid, (_, wrong) in graded.items() for what, g in wrong if g.stage == "passed"]
    assert passed == []
