"""One row's paragraphs and the two tools over them: `search` (BM25) and `read`.

Each episode searches only its own row's paragraphs (a MuSiQue row carries 20,
a synthetic world about 19), so the tools are built per row. `retrieved` keeps
the titles the model has been shown, for the supporting-paragraph recall.
"""

from __future__ import annotations

import re

from rank_bm25 import BM25Okapi

SEARCH_HITS = 3  # paragraphs a search returns
SNIPPET_WORDS = 40  # a hit shows the start of its paragraph; read() gives all of it

_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _snippet(text: str) -> str:
    parts = text.split()
    return " ".join(parts[:SNIPPET_WORDS]) + (" ..." if len(parts) > SNIPPET_WORDS else "")


class Corpus:
    """A row's paragraphs ([{"title", "paragraph_text", ...}]) with BM25 over title and text."""

    def __init__(self, paragraphs: list[dict]):
        if not paragraphs:
            raise ValueError("a multihop row needs at least one paragraph")
        self.paragraphs = paragraphs
        self.by_title: dict[str, dict] = {}
        for p in paragraphs:  # MuSiQue repeats a title now and then: read() shows the first
            self.by_title.setdefault(p["title"].strip().lower(), p)
        self.index = BM25Okapi([words(f"{p['title']} {p['paragraph_text']}") or ["_"] for p in paragraphs])
        self.retrieved: list[str] = []

    def _shown(self, title: str) -> None:
        if title not in self.retrieved:
            self.retrieved.append(title)

    def tools(self) -> dict:
        """{"search": fn, "read": fn} bound to this corpus, as the episode offers them to the model."""

        def search(query: str) -> str:
            """Search the encyclopedia. Returns the titles and openings of the best-matching paragraphs.

            Args:
                query: words to look for, such as a name.
            """
            terms = words(query)
            if not terms:
                return "Error: the query has no words to search for."
            scores = self.index.get_scores(terms)
            order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:SEARCH_HITS]
            hits = [self.paragraphs[i] for i in order if scores[i] > 0]
            if not hits:
                return f"No paragraph matches {query!r}."
            for p in hits:
                self._shown(p["title"])
            return "\n".join(f"{p['title']}: {_snippet(p['paragraph_text'])}" for p in hits)

        def read(title: str) -> str:
            """Read the encyclopedia paragraph with this title.

            Args:
                title: the paragraph's title, as search shows it.
            """
            p = self.by_title.get(title.strip().lower())
            if p is None:
                return f"No paragraph is titled {title!r}. Search for it first."
            self._shown(p["title"])
            return p["paragraph_text"]

        return {"search": search, "read": read}
