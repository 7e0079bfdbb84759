"""Multi-turn rollouts: the model and an environment take turns, all episodes at once.

An episode starts from the environment's first observation, sent through the
chat template as the user's message. Then, turn after turn:

  1. every unfinished episode of the batch gets one model turn, sampled in one
     batched call (mlx-lm's BatchGenerator, as for single-turn rollouts);
  2. each turn's text goes to its environment's `step`;
  3. the observation is appended to the conversation as the next user message
     (the chat template's own separators), and the next turn begins.

An episode ends when its environment says done, after `max_turns` model
turns, or when it reaches `max_episode_tokens` tokens after the first prompt
(a turn that reaches the budget without its end token is cut there, and
never goes to the environment).

The result is one `Episode` per (row, group member), a `Rollout` as
`rollout.Completion` is (update/batch.py; `truncated` when cut at the budget):
`tokens` is everything after the first prompt (model turns and observations in
order), `logprobs` the behaviour log-prob of each
sampled token (0 on observation tokens) and `mask` 1 on the model's tokens and
0 on the environment's, so the loss and its gradient see the model's tokens
only (batch.build_batch takes the mask from here).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable

import mlx.core as mx
import numpy as np

from ..tasks.data import encode_prompt
from ..tasks.rewarding import Scores
from ..tools.episode import tool_metrics
from .environment import Environment, Rendered
from .rollout import SamplingConfig
from .progress import PROGRESS  # who hears about a rollout's turns (the display sets it)
from .turns import Stats, player_for
from .width import decode_width

_MARK = "\x00OBSERVATION\x00"
STEP_THREADS = 16  # environments stepped at once after a turn (their tool calls wait on I/O, not the GIL)


@dataclass
class Episode:
    prompt_index: int  # which row of the batch
    prompt_tokens: list[int]  # the first observation through the chat template
    tokens: list[int] = field(default_factory=list)  # model turns and observations after the prompt
    logprobs: list[float] = field(default_factory=list)  # log mu on model tokens, 0 on observations
    mask: list[float] = field(default_factory=list)  # 1 on model tokens, 0 on observation tokens
    finish_reason: str | None = None  # "done" | "max_turns" | "max_tokens" | "env_error"
    turns: list[str] = field(default_factory=list)  # what the model wrote, turn by turn
    observations: list[str] = field(default_factory=list)  # what the environment answered
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # the environment's last info
    error: str = ""
    guided: bool = False  # a scripted episode put into its group by --guide (run/guidance.py), never sampled

    @property
    def truncated(self) -> bool:
        """Cut at its token budget (max_episode_tokens) before it ended: as a Completion cut at max_tokens.

        An episode that used all its turns (max_turns) was not cut: episode/max_turns_frac counts those."""
        return self.finish_reason == "max_tokens"

    @property
    def model_tokens(self) -> int:
        """Tokens the model wrote: the episode's tokens less its observations."""
        return int(sum(self.mask))

    @property
    def text(self) -> str:
        """A readable transcript: the model's turns and the observations between them."""
        out = []
        for i, turn in enumerate(self.turns):
            out.append(f"> {turn}")
            if i < len(self.observations):
                out.append(self.observations[i])
        return "\n".join(out)


@dataclass
class ChatJoin:
    """How an observation joins the conversation after a model turn, as text.

    With a chat template: the rest of the assistant's turn after its end token
    (Qwen: "\\n"), the user-turn header, the observation, the end of the user
    turn and the assistant header, exactly as the template writes them.
    """

    end_text: str  # the end-of-turn token as text (added when a turn was cut before it)
    before: str
    after: str
    tail: str = ""  # what the template writes after the end-of-turn token (Qwen: "\n")

    def text(self, observation: str, turn_ended: bool) -> str:
        end = "" if turn_ended else self.end_text
        if isinstance(observation, Rendered):  # headers included already (a tool episode's results)
            return end + self.tail + observation
        return end + self.before + observation + self.after


def chat_join(tokenizer, system_prompt: str | None = None) -> ChatJoin:
    eos = getattr(tokenizer, "eos_token", None) or ""
    if not getattr(tokenizer, "chat_template", None):
        return ChatJoin(eos, "\n", "\n")
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    first = tokenizer.apply_chat_template(messages, tokenize=False)
    both = tokenizer.apply_chat_template(
        messages + [{"role": "user", "content": _MARK}], tokenize=False, add_generation_prompt=True
    )
    if not both.startswith(first) or _MARK not in both:
        return ChatJoin(eos, "\n", "\n")  # a template that rewrites earlier turns: plain text
    tail = first[first.rindex("A") + 1 :]
    tail = tail[len(eos) :] if eos and tail.startswith(eos) else tail
    before, after = both[len(first) :].split(_MARK)
    return ChatJoin(eos, tail + before, after, tail)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def rollout_episodes(
    model,
    tokenizer,
    envs: list[Environment],
    group_size: int,
    sampling: SamplingConfig,
    max_turns: int,
    max_episode_tokens: int,
    system_prompt: str | None = None,
    concurrency: int = 256,
    seed: int | None = None,
    reuse_cache: bool = True,
    on_progress: Callable[[dict], None] | None = None,
    stats: Stats | None = None,
    memory_budget: int | None = None,
    first_prompt: int = 0,
) -> list[Episode]:
    """Play every environment to the end; `envs` are grouped, G consecutive ones per row.

    Returns the episodes in the same order, with rewards filled in. Episodes
    play in waves of as many as decode at once (width.decode_width: at most
    `concurrency`, and what `memory_budget` bytes of keys and values hold for
    episodes of max_episode_tokens). Episode e's tokens of turn t are drawn
    with keys of (seed, t, e) alone (turns.turn_row_seeds), e counted in the
    whole step: envs[0]'s row is the step's prompt number `first_prompt` (a
    data-parallel rank's share starts past 0), so a share plays the episodes
    one process would. MLX's global random state is never set here: a given
    seed leaves it untouched, and seed None draws one from it (only when the
    turns are sampled, temperature > 0). With reuse_cache (the default) each
    episode keeps its keys and values between turns where the model's cache
    allows (turns.player_for); otherwise every turn prefills the whole
    conversation again. on_progress (default: PROGRESS's) gets a dict at the
    start and end of every turn (see `_Progress`); stats, when given, collects
    each turn's costs.
    """
    join = chat_join(tokenizer, system_prompt)
    for env in envs:
        if hasattr(env, "bind"):  # a tool episode renders through this model's template
            env.bind(tokenizer)
    firsts = [env.reset() for env in envs]
    episodes = []
    for i, first in enumerate(firsts):
        if first != firsts[i - i % group_size]:
            raise ValueError("the environments of one group start differently; reset() must be deterministic")
        prompt = (
            _encode(tokenizer, first)
            if isinstance(first, Rendered)  # a tool episode's prompt, tools in it
            else encode_prompt(tokenizer, first, system_prompt)
        )
        episodes.append(Episode(i // group_size, prompt))
    if seed is None:  # greedy turns draw nothing: they leave MLX's global random state where it was
        seed = 0 if sampling.temperature <= 0 else int(mx.random.randint(0, 2**31 - 1, ()).item())

    first = first_prompt * group_size  # the step's number of episode 0 here
    player = player_for(model, tokenizer, group_size, seed, concurrency, reuse_cache, first)
    per_wave = len(episodes)
    if player.reuses_cache:  # a wave's rows keep their buffers from turn to turn: as many as fit at once
        longest = max(len(ep.prompt_tokens) for ep in episodes)
        width = decode_width(model, longest + max_episode_tokens, concurrency, memory_budget)
        per_wave = width if width < group_size else width // group_size * group_size
    progress = _Progress(len(episodes), max_turns, on_progress or PROGRESS.get())
    for start in range(0, len(episodes), per_wave):
        wave = list(range(start, min(len(episodes), start + per_wave)))
        if start:
            player = player_for(model, tokenizer, group_size, seed, concurrency, reuse_cache, first)
        try:
            _play(
                player,
                tokenizer,
                episodes,
                envs,
                wave,
                join,
                sampling,
                max_turns,
                max_episode_tokens,
                progress,
                stats,
            )
        finally:
            getattr(player, "close", lambda: None)()

    score_episodes(episodes, envs)
    return episodes


def score_episodes(episodes: list[Episode], envs: list[Environment]) -> None:
    """Each played episode's reward and named parts, from its environment; a failed one scores 0.

    Every episode that is trained on is scored here (a sampled one and a scripted one alike), so a
    reward never depends on how the turns were written."""
    for ep, env in zip(episodes, envs):
        if ep.error:
            ep.reward, ep.reward_parts = 0.0, {}
            continue
        try:
            ep.reward = float(env.reward())
            parts = env.reward_parts() if hasattr(env, "reward_parts") else {}
            ep.reward_parts = {k: float(v) for k, v in parts.items()}
        except Exception as e:
            ep.error, ep.reward, ep.reward_parts = f"{type(e).__name__}: {e}", 0.0, {}


class _Progress:
    """The rollout's running totals, sent to on_progress after every turn."""

    def __init__(self, episodes: int, max_turns: int, callback):
        self.callback = callback
        self.state = {
            "episodes": episodes,
            "finished": 0,
            "max_turns": max_turns,
            "turn": 0,
            "playing": 0,
            "tokens": 0,
            "prefilled": 0,
            "seconds": 0.0,
            "tokens_per_s": 0.0,
        }
        self.began = time.perf_counter()

    def update(self, **changes) -> None:
        state = self.state
        for key, value in changes.items():
            state[key] = state[key] + value if key in ("finished", "tokens", "prefilled") else value
        state["seconds"] = time.perf_counter() - self.began
        state["tokens_per_s"] = state["tokens"] / state["seconds"] if state["seconds"] > 0 else 0.0
        if self.callback is not None:
            self.callback(dict(state))


def _play(
    player, tokenizer, episodes, envs, wave, join, sampling, max_turns, max_episode_tokens, progress, stats
):
    """Play the episodes of one wave turn by turn until each has ended."""
    active = list(wave)
    chunks = {i: episodes[i].prompt_tokens for i in wave}  # what each episode feeds next
    for turn in range(max_turns):
        if not active:
            break
        progress.update(turn=turn + 1, playing=len(active))
        budget = {i: max_episode_tokens - len(episodes[i].tokens) for i in active}
        turn_sampling = replace(sampling, max_tokens=max(1, min(sampling.max_tokens, max(budget.values()))))
        if stats is not None:
            mx.reset_peak_memory()
        outs, costs = player.play(
            turn,
            active,
            [chunks[i] for i in active],
            [episodes[i].prompt_tokens + episodes[i].tokens for i in active],
            turn_sampling,
        )
        if stats is not None:
            stats.add(
                turn=turn,
                rows=len(active),
                longest=max(len(episodes[i].prompt_tokens) + len(episodes[i].tokens) for i in active),
                generated=sum(len(o.tokens) for o in outs),
                peak_gb=mx.get_peak_memory() / 1e9,
                **costs,
            )
        still, stepping = [], []
        for i, out in zip(active, outs):
            ep = episodes[i]
            tokens, logprobs = out.tokens[: budget[i]], out.logprobs[: budget[i]]
            ep.tokens += tokens
            ep.logprobs += logprobs
            ep.mask += [1.0] * len(tokens)
            if turn_cut(out, budget[i]):
                ep.turns.append(tokenizer.decode(tokens))
                ep.finish_reason = "max_tokens"
                continue
            ep.turns.append(out.text)
            stepping.append((i, out))
        results = _step_envs(envs, [(i, out.text) for i, out in stepping])
        for (i, out), (result, error) in zip(stepping, results):
            ep = episodes[i]
            if error is not None:  # an environment bug ends its episode, not the run
                ep.error, ep.finish_reason = f"{type(error).__name__}: {error}", "env_error"
                continue
            observation, done, info = result
            ep.info = info
            if done:
                ep.finish_reason = "done"
                continue
            if turn == max_turns - 1:
                ep.finish_reason = "max_turns"
                continue
            joined = _encode(
                tokenizer,
                join.text(
                    observation if isinstance(observation, Rendered) else str(observation),
                    out.finish_reason == "stop",
                ),
            )
            if len(ep.tokens) + len(joined) >= max_episode_tokens:  # no room left for a model turn
                ep.finish_reason = "max_tokens"
                continue
            ep.observations.append(str(observation))
            ep.tokens += joined
            ep.logprobs += [0.0] * len(joined)
            ep.mask += [0.0] * len(joined)
            # The turn's last sampled token was never fed: it goes first, then the observation.
            chunks[i] = out.tokens[-1:] + joined
            still.append(i)
        progress.update(
            finished=len(active) - len(still),
            playing=len(still),
            tokens=sum(len(o.tokens) for o in outs),
            prefilled=costs["prefilled"],
        )
        active = still


def turn_cut(out, budget: int) -> bool:
    """Whether a turn used all of its episode's remaining budget without ending it.

    The wave decodes up to the largest budget left, so a turn is measured against its own
    episode's: a turn that stops at exactly that many tokens for want of room (not at an end
    token) is cut as surely as one that ran past it.
    """
    ended = out.finish_reason == "stop" and len(out.tokens) <= budget
    return not ended and len(out.tokens) >= budget


def _step_envs(envs, moves: list[tuple[int, str]]) -> list[tuple[tuple | None, Exception | None]]:
    """env.step(text) for each (episode, text) of a turn, all at once: one episode's slow tool call
    (a web API, a sandbox) does not hold up the others'. (result, None) or (None, the exception)."""

    def step(move):
        i, text = move
        try:
            return envs[i].step(text), None
        except Exception as e:  # noqa: BLE001 - reported on the episode by the caller
            return None, e

    if len(moves) <= 1:
        return [step(m) for m in moves]
    with ThreadPoolExecutor(max_workers=min(STEP_THREADS, len(moves))) as pool:
        return list(pool.map(step, moves))


def episode_scores(episodes: list[Episode]) -> Scores:
    """The episodes' rewards as `rewarding.Scores`: total and named parts, errors counted."""
    names = list(dict.fromkeys(k for ep in episodes for k in ep.reward_parts))
    parts = {name: [ep.reward_parts.get(name) if not ep.error else None for ep in episodes] for name in names}
    errors = [ep.error for ep in episodes if ep.error]
    return Scores(
        total=np.array([ep.reward for ep in episodes], dtype=float),
        parts=parts,
        errors={"environment": len(errors)} if errors else {},
        error_examples={"environment": errors[0]} if errors else {},
    )


def episode_metrics(episodes: list[Episode]) -> dict:
    """Turns, solved rate, why episodes ended and, for tool episodes, their calls; for metrics.jsonl."""
    reasons = [ep.finish_reason for ep in episodes]
    out = {
        "episode/turns": float(np.mean([len(ep.turns) for ep in episodes])),
        "episode/model_tokens": float(np.mean([sum(ep.mask) for ep in episodes])),
        "episode/env_tokens": float(np.mean([len(ep.mask) - sum(ep.mask) for ep in episodes])),
    }
    for reason in ("done", "max_turns", "max_tokens", "env_error"):
        out[f"episode/{reason}_frac"] = float(np.mean([r == reason for r in reasons]))
    if any("solved" in ep.info for ep in episodes):  # environments that say so; others leave it out
        out["episode/solved"] = sum(bool(ep.info.get("solved")) for ep in episodes) / len(episodes)
    out.update(
        tool_metrics([ep.info for ep in episodes])
    )  # tool episodes only: the tool health rules read them
    return out


def make_envs(task, rows: list[dict], group_size: int) -> list[Environment]:
    return [task.make_env(row) for row in rows for _ in range(group_size)]
