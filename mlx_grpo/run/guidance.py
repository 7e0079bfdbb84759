"""Reference-guided groups (`guide: true`): where no sample is right, one member is a demonstration.

GRPO learns the main reward only from groups that hold a right answer. Where the
model almost never samples one (SmolLM2-135M on GSM8K: 3 "right" answers in 256
samples, every one a lucky last number), there is nothing to reinforce.
Off-policy guidance (LUFFY: Yan et al. 2025, arXiv:2504.14945) puts a known-good
answer into the group: in every group whose members are all wrong (tasks/accuracy.py:
a completion's accuracy reward below RIGHT, an episode not solved), the last member is
replaced by the row's demonstration, which is then scored as the task scores what it
samples (sampling/kinds.py's `score`). The group now holds a right answer, its
advantage is positive and the others' are negative, and the gradient raises the
demonstration's log-probability: advantage-weighted supervised learning, only where
the model's own samples give no signal. Groups that already hold a right answer are
left as sampled, and so is a group whose row has no demonstration.

A single-turn task's demonstration is its reference answer (GSM8K: the worked
solution), encoded once (it was never sampled, so there are no sampled ids to keep),
followed by the model's end token, or the task's first stop string for a base model,
whose plain-text frame ("...\nAnswer:") it follows after a space as the frame's worked
examples do. A multi-turn task's is the row's scripted episode (guided_episodes.py).
Either way its behaviour log-probs are the current policy's, at the sampling
temperature, so its ratio is 1 in the first update like any on-policy rollout's.
"""

from __future__ import annotations

import numpy as np

from ..config import ConfigError
from ..sampling.kinds import RolloutSettings, rollouts_for
from ..sampling.rollout import Completion, end_token_ids
from ..tasks.accuracy import accuracy_values, right, solved
from ..tasks.rewarding import Scores, reward_name
from ..update.logprobs import continuation_logprobs
from .guided_episodes import scripted_guides


def check_guidance(task) -> None:
    """A ConfigError unless the task can be guided: an episode task with scripts, or a single-turn task with
    an accuracy reward and reference answers."""
    if rollouts_for(task).plays_episodes:
        if task.reference_actions is None or not any(
            task.reference_actions(r) for r in task.train_rows[:100]
        ):
            raise ConfigError(
                f"--guide needs scripted episodes: task {task.name!r} plays episodes and has none "
                "(a task's reference_actions give a row's script)"
            )
        return
    if task.accuracy_reward is None:
        raise ConfigError(f"--guide needs a task with an accuracy reward; task {task.name!r} has none")
    if task.reference_answer is None or not any(task.reference_answer(r) for r in task.train_rows[:100]):
        raise ConfigError(
            f"--guide needs reference answers: task {task.name!r} has none (a custom data set "
            "gives them in a 'reference' column)"
        )


def reference_completion(
    model, tokenizer, task, prompt_tokens: list[int], text: str, prompt_index: int, temperature: float
) -> Completion:
    """The reference answer as a completion of prompt_tokens, with the policy's log-probs of its tokens."""
    frame = task.prompt_format or ""
    if frame and not frame[-1].isspace() and not text[:1].isspace():
        text = " " + text  # a base model's frame ends "Answer:" and its answers start with a space
    ending = task.stop[0] if task.stop else None
    tokens = list(tokenizer.encode(text + ending if ending else text, add_special_tokens=False))
    if not ending:
        tokens.append(end_token_ids(tokenizer)[0])
    behaviour = continuation_logprobs(model, prompt_tokens, tokens, temperature)
    return Completion(prompt_index, list(prompt_tokens), tokens, behaviour, "stop", text, guided=True)


def guide_groups(
    model, tokenizer, task, rows: list[dict], rollouts: list, scores: Scores, settings: RolloutSettings
) -> tuple[list, Scores]:
    """Replace the last member of every all-wrong group by its row's demonstration, scored anew."""
    kind = rollouts_for(task)
    group_size, temperature = settings.group_size, settings.sampling.temperature
    is_right = _right(task, rollouts, scores.parts, rows).reshape(len(rows), group_size)
    wrong = [i for i in range(len(rows)) if not is_right[i].any()]
    lasts = [rollouts[(i + 1) * group_size - 1] for i in wrong]
    if kind.plays_episodes:
        made = scripted_guides(
            model,
            tokenizer,
            task,
            [rows[i] for i in wrong],
            [r.prompt_index for r in lasts],
            temperature,
            settings.max_turns,
            settings.max_episode_tokens,
        )
    else:
        made = [
            reference_completion(
                model, tokenizer, task, last.prompt_tokens, text, last.prompt_index, temperature
            )
            if (text := task.reference_answer(rows[i]))
            else None
            for i, last in zip(wrong, lasts)
        ]
    replaced = [(i, guide) for i, guide in zip(wrong, made) if guide is not None]
    if not replaced:
        return list(rollouts), scores
    # Scored as the kind scores what it samples, so a demonstration's reward is comparable inside its group.
    rescored, _ = kind.score([rows[i] for i, _ in replaced], [guide for _, guide in replaced], 1)
    rollouts = list(rollouts)
    positions = [(i + 1) * group_size - 1 for i, _ in replaced]
    for at, (_, guide) in zip(positions, replaced):
        rollouts[at] = guide
    return rollouts, _put(scores, positions, rescored)


def _right(task, rollouts: list, parts: dict, rows: list[dict] | None = None) -> np.ndarray | None:
    """Which members are right, as tasks/accuracy.py judges them: an episode when solved, an answer by the
    accuracy reward, read from `parts`, else computed for `rows` (None without them)."""
    if rollouts_for(task).plays_episodes:
        return np.array([solved(r) for r in rollouts], dtype=bool)
    values = parts.get(reward_name(task.accuracy_reward))
    if values is None and rows is not None:
        values = accuracy_values(task, rows, len(rollouts) // len(rows), rollouts)
    return None if values is None else right(values)


def _put(scores: Scores, positions: list[int], rescored: Scores) -> Scores:
    """`scores` with the members at `positions` scored as `rescored` says (the passed-in scores unchanged)."""
    total = np.array(scores.total, dtype=np.float64)
    total[positions] = rescored.total
    parts = {name: list(values) for name, values in scores.parts.items()}
    for name, values in rescored.parts.items():
        column = parts.setdefault(name, [None] * len(total))
        for at, value in zip(positions, values):
            column[at] = value
    errors = dict(scores.errors)
    for name, n in rescored.errors.items():
        errors[name] = errors.get(name, 0) + n
    return Scores(
        total=total,
        parts=parts,
        errors=errors,
        error_examples={**rescored.error_examples, **scores.error_examples},
    )


def without_guided_negatives(advantages, guided, group_size: int) -> np.ndarray:
    """`guide_negatives: false`: in a group holding a reference, the model's own answers get advantage 0.

    Every sampled member of a guided group is wrong, so each gets a negative
    advantage, and the update pushes down what the model wrote, its end of
    answer included, while it pushes up a reference the model did not write:
    on Qwen2.5-Coder-0.5B's OCaml runs the entropy rose 0.23 -> 0.4-0.7 and answers
    cut at max_tokens grew. With them at 0 a guided
    group is advantage-weighted supervised learning on the reference alone;
    groups without a reference are untouched. On that model, measured once, the
    entropy rose just the same, and without the negatives the overlong penalty
    did not reach the guided groups (greedy answers cut at max_tokens 19%,
    against 7% with them).
    """
    advantages = np.array(advantages, dtype=np.float64).reshape(-1, group_size)
    guided = np.asarray(guided, dtype=bool).reshape(-1, group_size)
    advantages[guided.any(axis=1, keepdims=True) & ~guided] = 0.0
    return advantages.reshape(-1)


def guided_metrics(task, rollouts: list, parts: dict[str, list], group_size: int) -> dict:
    """How many groups were guided, and the accuracy of the model's own samples (the demonstrations left
    out)."""
    guided = np.array([r.guided for r in rollouts])
    is_right = _right(task, rollouts, parts)
    metrics = {"guide/groups_frac": float(guided.reshape(-1, group_size).any(axis=1).mean())}
    if is_right is not None:
        metrics["guide/sampled_accuracy"] = float(is_right[~guided].mean()) if (~guided).any() else 0.0
    return metrics
