"""`guide: true` on a multi-turn task: a row's scripted episode, ready to stand in a group.

The script (`Task.reference_actions`: the web task's planned actions) plays the model's turns
against a fresh environment of the row through the turn loop rollouts use
(sampling/demonstrations.py), so its tokens, mask and reward are what a sampled episode
that wrote those actions would have. Only its behaviour log-probs are the policy's own, from
one forward pass at the sampling temperature (0 on the pages between turns, as a rollout
records them), so its ratio is 1 in the first update like a sampled episode's. A row without
a script, or whose script takes more than max_turns actions or does not solve its episode within
the token budget, gets none.
"""

from __future__ import annotations

from dataclasses import replace

from ..models.untrained_tokens import indistinct_tokens
from ..sampling.demonstrations import scripted_episodes
from ..sampling.multiturn import Episode, make_envs
from ..tasks.accuracy import solved
from ..update.logprobs import continuation_logprobs


def scripted_guides(
    model,
    tokenizer,
    task,
    rows: list[dict],
    prompt_indices: list[int],
    temperature: float,
    max_turns: int,
    max_episode_tokens: int,
) -> list[Episode | None]:
    """Each row's scripted episode as a guided member of its group (prompt_indices: the groups'), or None."""
    scripts = [task.reference_actions(row) or [] for row in rows]
    # A script longer than max_turns is an episode the run's rollouts could never play.
    playable = [i for i, script in enumerate(scripts) if 0 < len(script) <= max_turns]
    # Tokens the head cannot tell apart are spelled out, as `mlx-grpo sft` writes the same scripts.
    played = scripted_episodes(
        tokenizer,
        make_envs(task, [rows[i] for i in playable], 1),
        [scripts[i] for i in playable],
        task.system_prompt,
        max_episode_tokens,
        indistinct_tokens(model, tokenizer),
    )
    guides: list[Episode | None] = [None] * len(rows)
    for i, episode in zip(playable, played):
        # A script cut at the budget, broken by its environment or short of the goal demonstrates nothing.
        if episode.finish_reason == "done" and solved(episode):
            guides[i] = replace(
                episode,
                prompt_index=prompt_indices[i],
                guided=True,
                logprobs=_behaviour(model, episode, temperature),
            )
    return guides


def _behaviour(model, episode: Episode, temperature: float) -> list[float]:
    after_prompt = continuation_logprobs(model, episode.prompt_tokens, episode.tokens, temperature)
    return [lp if trained else 0.0 for lp, trained in zip(after_prompt, episode.mask)]
