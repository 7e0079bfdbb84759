"""What completions.jsonl keeps of a multi-turn episode beyond its readable transcript.

The transcript (`Episode.text`, the record's "completion") shows what was said,
not what was trained on. `segments` is the episode after its prompt cut where
the loss mask changes, each run of tokens decoded on its own: the model's turns
(trained) and what was inserted between them (masked: the template's role
headers, observations, tool results). It is the mask build_batch hands the loss,
so `mlx-grpo inspect RUN_DIR --step N --index K` marks exactly the tokens that
had no gradient. A tool episode also keeps each turn's calls as its environment
read them ("calls"). The segments repeat the transcript's text, so an episode's
record is about twice its transcript; single-turn records are unchanged.
"""

from __future__ import annotations


def episode_segments(tokenizer, tokens: list[int], mask: list[float]) -> list[dict]:
    """Runs of equally masked tokens, decoded: [{"text", "trained"}], in order."""
    segments, start = [], 0
    for i in range(1, len(tokens) + 1):
        if i == len(tokens) or bool(mask[i]) != bool(mask[start]):
            segments.append({"text": tokenizer.decode(tokens[start:i]), "trained": bool(mask[start])})
            start = i
    return segments


def episode_record(tokenizer, episode) -> dict:
    """The fields a multi-turn episode adds to its completions.jsonl record."""
    record = {
        "turns": len(episode.turns),
        "segments": episode_segments(tokenizer, episode.tokens, episode.mask),
    }
    if "calls" in episode.info:  # a tool episode: each turn's calls as read, with how each went
        record["calls"] = episode.info["calls"]
    return record
