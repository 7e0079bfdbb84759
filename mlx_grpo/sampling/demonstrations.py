"""A built-in task's own demonstrations, as supervised fine-tuning's (token ids, trained flags).

A single-turn task's is its reference answer to a prompt (`Task.reference_answer`: the arith
and GSM8K worked solutions, the OCaml reference programs), after the prompt exactly as a
training step renders it. A multi-turn task's is a scripted episode (`Task.reference_actions`:
the web task's planned actions): the script plays the model's turns against the row's
environment through the very turn loop a rollout uses (multiturn.py), so the tokens are the
ones the model sees in reinforcement learning, and the pages between turns are read only,
masked exactly as the RL update masks observations.
"""

from __future__ import annotations

from ..models.untrained_tokens import encode_spelled
from ..tasks.data import DataError, LoadReport, encode_prompt
from ..tasks.sft_data import encode_demonstration
from .environment import Rendered
from .kinds import rollouts_for
from .multiturn import Episode, _encode, _play, _Progress, chat_join, make_envs, score_episodes
from .rollout import Completion, SamplingConfig


class ScriptedTurns:
    """A player (turns.py's protocol) whose turns are a script's actions, each ended by the end token.

    `spelled`: tokens the model cannot write apart from others (models/untrained_tokens.py), written out."""

    reuses_cache = False

    def __init__(self, tokenizer, scripts: list[list[str]], spelled: dict[int, str] | None = None):
        self.tokenizer, self.scripts, self.spelled = tokenizer, scripts, spelled or {}
        self.end = [tokenizer.eos_token_id]

    def play(self, turn, episodes, chunks, contexts, sampling):
        outs = []
        for e, context in zip(episodes, contexts):
            script = self.scripts[e]
            text = script[turn] if turn < len(script) else ""
            tokens = encode_spelled(self.tokenizer, text, self.spelled) + self.end
            outs.append(Completion(e, list(context), tokens, [0.0] * len(tokens), "stop", text))
        return outs, {"prefilled": 0}


def scripted_episodes(
    tokenizer,
    envs: list,
    scripts: list[list[str]],
    system_prompt: str | None,
    max_episode_tokens: int,
    spelled: dict[int, str] | None = None,
) -> list[Episode]:
    """Each environment played with its script's actions as the model's turns, and scored, as rollout_episodes
    plays and scores them."""
    join = chat_join(tokenizer, system_prompt)
    episodes = []
    for i, env in enumerate(envs):
        if hasattr(env, "bind"):
            env.bind(tokenizer)
        first = env.reset()
        prompt = (
            _encode(tokenizer, first)
            if isinstance(first, Rendered)
            else encode_prompt(tokenizer, first, system_prompt)
        )
        episodes.append(Episode(i, prompt))
    turns = max((len(s) for s in scripts), default=0)
    wave = list(range(len(episodes)))
    _play(
        ScriptedTurns(tokenizer, scripts, spelled),
        tokenizer,
        episodes,
        envs,
        wave,
        join,
        SamplingConfig(temperature=0.0),
        turns,
        max_episode_tokens,
        _Progress(len(episodes), turns, None),
        None,
    )
    score_episodes(episodes, envs)
    return episodes


def episode_example(episode: Episode) -> tuple[list[int], list[float]]:
    """An episode's tokens after its first prompt, the model's turns trained and the prompt and pages not."""
    return episode.prompt_tokens + episode.tokens, [0.0] * len(episode.prompt_tokens) + list(episode.mask)


def task_demonstrations(
    task,
    tokenizer,
    rows: list[dict],
    max_episode_tokens: int,
    on_bad: str,
    source: str,
    spelled: dict[int, str] | None = None,
) -> tuple[list[tuple[list[int], list[float]]], str]:
    """(examples, note): the rows' demonstrations; a row without one, or whose scripted episode does not
    end solved within max_episode_tokens, is skipped and counted (on_bad="error": DataError). `spelled`:
    tokens a scripted action writes out in ordinary tokens (models/untrained_tokens.py)."""
    report = LoadReport(source=source, on_bad=on_bad)
    examples = []
    if rollouts_for(task).plays_episodes:
        if task.reference_actions is None:
            raise DataError(f"task {task.name!r} has no scripted episodes to learn from")
        scripts = [task.reference_actions(row) or [] for row in rows]
        episodes = scripted_episodes(
            tokenizer, make_envs(task, rows, 1), scripts, task.system_prompt, max_episode_tokens, spelled
        )
        for number, (episode, script) in enumerate(zip(episodes, scripts), start=1):
            if not script:
                report.skip(number, "no scripted episode", "row")
            elif episode.finish_reason != "done" or episode.error:
                why = (
                    episode.error
                    or f"ended by {episode.finish_reason} (max_episode_tokens {max_episode_tokens})"
                )
                report.skip(number, f"the scripted episode did not finish: {why}", "row")
            else:
                examples.append(episode_example(episode))
    else:
        if task.reference_answer is None:
            raise DataError(f"task {task.name!r} has no reference answers to learn from")
        for number, row in enumerate(rows, start=1):
            answer = task.reference_answer(row)
            if not answer:
                report.skip(number, "no reference answer", "row")
                continue
            examples.append(
                encode_demonstration(
                    tokenizer,
                    {"prompt": row["prompt"], "completion": answer},
                    task.system_prompt,
                    task.prompt_format,
                    task.stop,
                )
            )
    report.rows = len(examples)
    if rows and not examples:
        raise DataError(f"{source}: no usable demonstrations ({report.summary()})")
    return examples, report.summary() or ""
