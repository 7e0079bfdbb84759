"""Rewards from a judge model (RLAIF): a second local model grades the completions.

Where no checker exists (style, clarity, "is this explanation right"), a model
can grade. The rubric, a prompt template, shows the judge the prompt and the
completion and asks for a score on a stated scale; the judge's answer is parsed
into [0, 1]. A judge is a learned reward that a policy can learn to please
rather than to be right: keep a checkable reward or accuracy beside it and
watch both (README: "A judge model as reward").

    judge = make_judge_reward("smollm2-135m", "ocaml_quality")
    judge(prompts, completions, **columns)        # [0.67, None, 1.0, ...]

Cost: every completion of one call (the trainer makes one call a step, with
the whole step's completions) is judged in one batched greedy decode through
the rollout sampler; a judge prompt already judged in this run is not decoded
again; each judge model is loaded once a process.

Rubrics are text with `{prompt}`, `{completion}` and any data column by name
(`{answer}`). Only what the rubric names reaches the judge: it never sees the
reference answer unless the rubric asks for that column. `{{` and `}}` are
literal braces; other braces stay as written. Optional first lines:
`scale: 1-10` states the scale (1-10 when absent); `answer starts: Score:`
writes the start of the judge's answer for it, so that it continues with the
number (SmolLM2-135M asked for "Score: N" wrote prose first; told that its
answer starts "Score:", it wrote a number, once the rubric no longer showed
it the letter N to copy). Built-in rubrics live in rewards/rubrics/ and are
named without ".txt".

An answer the parser cannot read is None (not applicable: the completion gets
no judge reward), never a guessed number; so is a judge prompt longer than the
judge's context, which is not decoded. The share of those is a metric.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from mlx_grpo.models.loading import load_policy, resolve_model_path
from mlx_grpo.sampling import fixed_decode
from mlx_grpo.sampling.rollout import SamplingConfig, sample_completions
from mlx_grpo.tasks.data import encode_prompt
from rewards import completion_text

RUBRIC_DIR = Path(__file__).parent / "rubrics"
DEFAULT_RUBRIC = "general"
DEFAULT_SCALE = (1.0, 10.0)
# Room for "Score: 10" and a few words around it; the rubric asks for one line.
DEFAULT_MAX_TOKENS = 16

_FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_]\w*)\}")
_SCALE_LINE = re.compile(r"scale:\s*(-?\d+(?:\.\d+)?)\s*(?:-|to)\s*(-?\d+(?:\.\d+)?)", re.I | re.A)
_ANSWER_LINE = re.compile(r"answer starts:[ \t]?(.*)", re.I)
_NUMBER = r"(-?\d+(?:\.\d+)?)"
_OUT_OF = rf"(?:\s*(?:/|out\s+of)\s*{_NUMBER})?"
_KEYWORD_SCORE = re.compile(
    rf"\b(?:score|rating|grade)\b[\s:=*]*(?:(?:is|of)\s+)?{_NUMBER}{_OUT_OF}", re.I | re.A
)
_BARE_SCORE = re.compile(rf"[\s*]*{_NUMBER}{_OUT_OF}[\s*.!]*", re.I | re.A)


class JudgeError(ValueError):
    """A rubric or a judge model that cannot be used; the message says why, in one line."""


@dataclass(frozen=True)
class Rubric:
    template: str
    scale: tuple[float, float] = DEFAULT_SCALE
    name: str = "rubric"
    answer_start: str = ""  # written as the start of the judge's answer; it continues from there

    @property
    def fields(self) -> list[str]:
        """The names in braces, in order of first use."""
        return list(dict.fromkeys(m.group(1) for m in _FIELD.finditer(self.template) if m.group(1)))

    @property
    def columns(self) -> list[str]:
        """The data columns the rubric shows the judge."""
        return [f for f in self.fields if f not in ("prompt", "completion")]


def parse_rubric(text: str, name: str = "rubric") -> Rubric:
    """A rubric from its text; JudgeError when it cannot work."""
    scale, answer_start = DEFAULT_SCALE, ""
    while True:  # the optional lines at the top
        first, _, rest = text.partition("\n")
        if stated := _SCALE_LINE.fullmatch(first.strip()):
            scale = (float(stated.group(1)), float(stated.group(2)))
            if not scale[0] < scale[1]:
                raise JudgeError(
                    f"rubric {name}: the scale's low end must be below its high end, got {first.strip()!r}"
                )
        elif start := _ANSWER_LINE.fullmatch(first.strip()):
            answer_start = start.group(1)
        else:
            break
        text = rest
    rubric = Rubric(text.strip() + "\n", scale, name, answer_start)
    if "completion" not in rubric.fields:
        raise JudgeError(f"rubric {name} has no {{completion}}: the judge would not see what it grades")
    return rubric


def builtin_rubrics() -> list[str]:
    return sorted(p.stem for p in RUBRIC_DIR.glob("*.txt"))


def load_rubric(source: str | None = None) -> Rubric:
    """A rubric file, or a built-in rubric's name (None: the general one)."""
    source = source or DEFAULT_RUBRIC
    path = Path(source).expanduser()
    if not path.exists() and source in builtin_rubrics():
        path = RUBRIC_DIR / f"{source}.txt"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        builtin = ", ".join(builtin_rubrics())
        raise JudgeError(f"rubric file not found: {source} (built-in rubrics: {builtin})") from None
    except UnicodeDecodeError:
        raise JudgeError(f"rubric file {source} is not UTF-8 text") from None
    except OSError as e:
        raise JudgeError(f"rubric file {source} cannot be read: {e.strerror or e}") from None
    return parse_rubric(text, str(source))


def _shown(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(m, dict) and "content" in m for m in value
    ):  # chat messages
        return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in value)
    return json.dumps(value, ensure_ascii=False, default=str)


def judge_prompts(rubric: Rubric, prompts: list, completions: list, columns: dict[str, list]) -> list[str]:
    """The rubric filled in for each completion, in one pass: text that is filled in
    (a completion that writes "{answer}") is never filled in again."""
    filled = []
    for i, completion in enumerate(completions):

        def value(match: re.Match) -> str:
            name = match.group(1)
            if name is None:  # {{ or }}
                return match.group(0)[0]
            if name == "prompt":
                return _shown(prompts[i])
            if name == "completion":
                return completion_text(completion)
            if name not in columns:
                raise KeyError(f"the rubric names {{{name}}} but the data has no {name!r} column")
            return _shown(columns[name][i])

        filled.append(_FIELD.sub(value, rubric.template))
    return filled


def parse_score(answer, scale: tuple[float, float] = DEFAULT_SCALE) -> float | None:
    """The judge's score mapped from `scale` onto [0, 1], or None when it cannot be read.

    Read: "Score: 7", "Rating: 7/10", "score of 7 out of 10", or an answer whose
    first line is the number alone ("7", "7/10"). Not read: no number, a
    number off the scale, a "/N" that is not the scale's top, or several
    scores that disagree.
    """
    if not isinstance(answer, str):
        return None
    low, high = scale
    found = [(float(n), d) for n, d in _KEYWORD_SCORE.findall(answer)]
    if not found:
        lines = [line for line in answer.splitlines() if line.strip()]
        bare = _BARE_SCORE.fullmatch(lines[0]) if lines else None
        found = [(float(bare.group(1)), bare.group(2))] if bare else []
    values = {v for v, _ in found}
    if len(values) != 1 or any(d and float(d) != high for _, d in found):
        return None
    (v,) = values
    return (v - low) / (high - low) if low <= v <= high else None


_LOADED: dict[tuple, tuple] = {}


def load_judge(model: str | None, keep_quantized: bool = False):
    """(model, tokenizer) of a judge, loaded once a process; any model source load_policy takes.

    A quantized judge runs on a float32 copy on the CPU when that fits, as a policy
    does (models/quantized.py: MLX's quantized matmul is slow there), unless keep_quantized.
    """
    key = (resolve_model_path(model), keep_quantized)
    if key not in _LOADED:
        try:
            judge, tokenizer = load_policy(model, keep_quantized=keep_quantized)
        except Exception as e:  # a missing folder, a corrupt file, an unknown alias: one line
            first = (str(e).strip().splitlines() or [""])[0]
            raise JudgeError(f"judge {model} could not be loaded: {type(e).__name__}: {first}") from None
        _LOADED[key] = (judge, tokenizer)
    return _LOADED[key]


class JudgeReward:
    """The reward function named `judge`: fn(prompts, completions, **columns) -> list[float | None]."""

    __name__ = "judge"
    # The judge decodes in this process, on MLX: a call cannot be abandoned in a
    # thread the way a hung reward is (rewarding.with_timeout), and max_tokens bounds it.
    no_timeout = True

    def __init__(
        self, model, tokenizer, rubric: Rubric, max_tokens: int = DEFAULT_MAX_TOKENS, concurrency: int = 256
    ):
        self.model, self.tokenizer, self.rubric = model, tokenizer, rubric
        fixed_decode.keep_compiled(model)  # it decodes between the policy's rollouts: no recompiling
        self.max_tokens, self.concurrency = max_tokens, concurrency
        self.answers: dict[bytes, tuple[float | None, str]] = {}  # judge prompt digest -> (score, answer)
        self._since = _no_counts()

    def __call__(self, prompts, completions, **columns) -> list[float | None]:
        texts = judge_prompts(self.rubric, prompts, completions, columns)
        keys = [hashlib.sha256(t.encode("utf-8")).digest() for t in texts]
        new = {k: t for k, t in zip(keys, texts) if k not in self.answers}  # each distinct prompt once
        if new:
            start = time.perf_counter()
            for key, answer in zip(new, self.generate(list(new.values()))):
                self.answers[key] = (parse_score(answer, self.rubric.scale), answer)
            self._since["seconds"] += time.perf_counter() - start
            self._since["decoded"] += len(new)
        scores = [self.answers[k][0] for k in keys]
        unreadable = [self.answers[k][1] for k in keys if self.answers[k][0] is None]
        self._since["judged"] += len(keys)
        self._since["unreadable"] += len(unreadable)
        if unreadable and self._since["example"] is None:
            self._since["example"] = unreadable[0][:200]
        return scores

    def generate(self, texts: list[str]) -> list[str]:
        """The judge's greedy answers to filled-in rubrics: one batched decode."""
        start = self.rubric.answer_start
        written = list(self.tokenizer.encode(start, add_special_tokens=False)) if start else []
        prompts = [encode_prompt(self.tokenizer, t) + written for t in texts]
        # Past its context a model's answer means nothing: such a prompt is not decoded, and its
        # answer (no score in it) reads as None, with the reason in judge/unreadable_example.
        context = getattr(getattr(self.model, "args", None), "max_position_embeddings", None)
        answers = [
            f"(not judged: {len(p)} prompt tokens and {self.max_tokens} to answer pass the judge's "
            f"context of {context})"
            for p in prompts
        ]
        fits = [i for i, p in enumerate(prompts) if not context or len(p) + self.max_tokens <= context]
        if fits:
            self.model.eval()
            completions = sample_completions(
                self.model,
                self.tokenizer,
                [prompts[i] for i in fits],
                1,
                SamplingConfig(temperature=0.0, max_tokens=self.max_tokens),
                self.concurrency,
                seed=0,
            )
            for i, c in zip(fits, completions):
                answers[i] = start + c.text
        return answers

    def pop_metrics(self) -> dict:
        """What the judge did since the last call: time, unreadable answers, prompts decoded."""
        since, self._since = self._since, _no_counts()
        if not since["judged"]:
            return {}
        metrics = {
            "time/judge_s": since["seconds"],
            "judge/unreadable_frac": since["unreadable"] / since["judged"],
            "judge/decoded": since["decoded"],
        }
        if since["example"] is not None:
            metrics["judge/unreadable_example"] = since["example"]
        return metrics


def _no_counts() -> dict:
    return {"seconds": 0.0, "judged": 0, "unreadable": 0, "decoded": 0, "example": None}


def make_judge_reward(
    model,
    rubric: Rubric | str | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    concurrency: int = 256,
    keep_quantized: bool = False,
) -> JudgeReward:
    """A reward function named `judge` that asks `model` to grade each completion by `rubric`.

    model: any model source load_policy takes (a folder, a GGUF file, an alias,
    "embedded"), or a loaded (model, tokenizer) pair. rubric: a Rubric, the
    rubric's text (any text with "{completion}"), a rubric file, or a built-in
    rubric's name; None: the general rubric. Raises JudgeError.
    """
    if not isinstance(rubric, Rubric):
        rubric = parse_rubric(rubric) if rubric and "{completion}" in rubric else load_rubric(rubric)
    judge, tokenizer = model if isinstance(model, tuple) else load_judge(model, keep_quantized)
    return JudgeReward(judge, tokenizer, rubric, max_tokens, concurrency)
