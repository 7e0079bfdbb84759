"""The action language: one action per turn, written exactly as

    search[query]   click[id]   type[id][text]   select[id][option]   back   answer[text]

Whitespace around the action is ignored; anything else (two actions, prose
around it, a missing bracket, a word that is no action, a placeholder of the
list above copied as it stands, such as `click[id]` or `answer[text]`) makes
the turn invalid. `parse_action` never raises: it returns an Action or the reason the
text is not one, which the environment shows as the next observation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACTION_HELP = "search[query], click[id], type[id][text], select[id][option], back, answer[text]"

# name -> number of bracketed arguments
ARITY = {"search": 1, "click": 1, "type": 2, "select": 2, "back": 0, "answer": 1}
# The text placeholders of ACTION_HELP (element numbers are refused as not digits): a model that copies
# `answer[text]` from the list has answered nothing (Qwen2.5-Coder-0.5B learned to, docs/real-models.md).
PLACEHOLDERS = {"search": "query", "answer": "text"}

_ACTION_RE = re.compile(r"^([a-z]+)((?:\[[^\[\]\n]*\])*)$")
_ARG_RE = re.compile(r"\[([^\[\]\n]*)\]")


@dataclass(frozen=True)
class Action:
    name: str
    args: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.name + "".join(f"[{a}]" for a in self.args)


def parse_action(text) -> tuple[Action | None, str]:
    """(the action, "") or (None, why it is not a valid action)."""
    if not isinstance(text, str):
        return None, "an action must be text"
    text = text.strip()
    if not text:
        return None, "empty action"
    match = _ACTION_RE.match(text)
    if match is None:
        return None, "not an action (write exactly one action and nothing else)"
    name, rest = match.group(1), match.group(2)
    if name not in ARITY:
        return None, f"unknown action {name!r}"
    args = tuple(a.strip() for a in _ARG_RE.findall(rest))
    if len(args) != ARITY[name]:
        return None, f"{name} takes {ARITY[name]} argument(s) in brackets, got {len(args)}"
    if name in ("click", "type", "select") and not args[0].isdigit():
        return None, f"{name} needs an element number, got {args[0]!r}"
    if name in ("search", "answer") and not args[0]:
        return None, f"{name} needs some text"
    if args and args[0].lower() == PLACEHOLDERS.get(name):
        return None, f"{name}[{args[0]}] is the placeholder of the action list; write the {args[0]} itself"
    return Action(name, args), ""


def format_action(name: str, *args) -> str:
    return str(Action(name, tuple(str(a) for a in args)))
