"""The shipped OCaml problems and hand-made answers to sum_list, shared by the OCaml task's test files."""

from rewards import ocaml

TRAIN, VALIDATION, TEST = ocaml.problems("train"), ocaml.problems("validation"), ocaml.problems("test")
ALL = TRAIN + VALIDATION + TEST
SUM_LIST = next(p for p in ALL if p["id"] == "sum_list")


def fenced(code: str) -> str:
    return f"Here is the function:\n\n```ocaml\n{code.strip()}\n```\n"


HAND_MADE = {  # for sum_list, best first
    "correct": "let sum_list (xs : int list) : int =\n  List.fold_left ( + ) 0 xs",
    "partial": (
        "let sum_list (xs : int list) : int =\n  List.fold_left (fun a x -> if x > 0 then a + x else a) 0 xs"
    ),
    "wrong": "let sum_list (xs : int list) : int =\n  List.length xs + 42",
    # its own type clashes with the tests
    "does_not_compile": "let sum_list xs = List.fold_left ( +. ) 0. xs",
    "type_error": 'let sum_list (xs : int list) : int =\n  List.fold_left ( + ) "0" xs',
    "syntax_error": "let sum_list (xs : int list) : int =\n  List.fold_left ( + ) 0 xs +",
}
