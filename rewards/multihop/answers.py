"""Scoring a final answer: exact match and token F1 against the answer and its aliases (as MuSiQue
and SQuAD score), and the recall of supporting paragraphs the episode retrieved.

The answer is the text of the model's last turn, or what follows its last
"Answer:" when it writes one. Both sides are normalized the SQuAD way: lower
case, punctuation and the articles a/an/the dropped, spaces collapsed.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)


def final_answer(text: str) -> str:
    """What a completion answers: after its last "Answer:", else all of it."""
    marks = list(_ANSWER.finditer(text))
    return (text[marks[-1].end() :] if marks else text).strip()


def normalize(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(_ARTICLES.sub(" ", text).split())


def _golds(answer: str, aliases) -> list[str]:
    return [answer, *(aliases or [])]


def exact_match(prediction: str, answer: str, aliases=None) -> float:
    guess = normalize(final_answer(prediction))
    return float(any(guess == normalize(g) for g in _golds(answer, aliases)))


def token_f1(prediction: str, answer: str, aliases=None) -> float:
    guess = normalize(final_answer(prediction)).split()
    best = 0.0
    for gold in _golds(answer, aliases):
        gold_words = normalize(gold).split()
        same = sum((Counter(guess) & Counter(gold_words)).values())
        if same:
            precision, recall = same / len(guess), same / len(gold_words)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def support_recall(paragraphs: list[dict], retrieved: list[str]) -> float | None:
    """The share of supporting paragraphs whose titles the episode was shown; None when none is marked."""
    supporting = {p["title"] for p in paragraphs if p.get("is_supporting")}
    if not supporting:
        return None
    return len(supporting & set(retrieved)) / len(supporting)


# The task's reward functions (the protocol of mlx_grpo/tasks/rewarding.py): one score per completion.


def exact_match_reward(prompts, completions, answer, answer_aliases=None, **_) -> list[float]:
    aliases = answer_aliases or [None] * len(completions)
    return [exact_match(c, a, al) for c, a, al in zip(completions, answer, aliases)]


def f1_reward(prompts, completions, answer, answer_aliases=None, **_) -> list[float]:
    aliases = answer_aliases or [None] * len(completions)
    return [token_f1(c, a, al) for c, a, al in zip(completions, answer, aliases)]


def support_reward(prompts, completions, paragraphs, retrieved=None, **_) -> list[float | None]:
    """Recall of supporting paragraphs; `retrieved` is the episode's (MultihopEnv passes it)."""
    retrieved = retrieved or [[] for _ in completions]
    return [support_recall(p, r) for p, r in zip(paragraphs, retrieved)]
