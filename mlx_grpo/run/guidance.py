"""Reference-guided groups (`guide: true`): where no sample is right, one member is the reference answer.

GRPO learns the main reward only from groups that hold a right answer. Where the
model almost never samples one (SmolLM2-135M on GSM8K: 3 "right" answers in 256
samples, every one a lucky last number), there is nothing to reinforce.
Off-policy guidance (LUFFY: Yan et al. 2025, arXiv:2504.14945) puts a known-good
answer into the group: in every group whose completions are all wrong (the task's
accuracy reward below tasks/accuracy.py's RIGHT), the last completion is replaced by the row's reference
answer (GSM8K: its worked solution), which is then scored like any completion. The
group now holds a right answer, its advantage is positive and the others' are
negative, and the gradient raises the reference's log-probability: advantage-weighted
supervised learning, only where the model's own samples give no signal. Groups that
already hold a right answer are left as sampled.

The reference is encoded once (it was never sampled, so there are no sampled ids to
keep), followed by the model's end token, or the task's first stop string for a base
model, whose plain-text frame ("...\nAnswer:") it follows after a space as the frame's
worked examples do. Its behaviour log-probs are the current policy's, at the sampling temperature,
so its ratio is 1 in the first update like any on-policy completion's.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..config import ConfigError
from ..sampling.kinds import rollouts_for
from ..sampling.rollout import Completion, end_token_ids
from ..tasks.accuracy import accuracy_values, right
from ..tasks.data import columns_of
from ..tasks.rewarding import Scores, reward_name, score_completions
from ..update.logprobs import token_logprobs

def check_guidance(task) -> None:
    """A ConfigError unless the task can be guided: single-turn, an accuracy reward, reference answers."""
    if rollouts_for(task).plays_episodes:
        raise ConfigError(f"--guide needs a single-turn task; task {task.name!r} plays episodes")
    if task.accuracy_reward is None:
        raise ConfigError(f"--guide needs a task with an accuracy reward; task {task.name!r} has none")
    if task.reference_answer is None or not any(task.reference_answer(r) for r in task.train_rows[:100]):
        raise ConfigError(f"--guide needs reference answers: task {task.name!r} has none (a custom data set "
                          "gives them in a 'reference' column)")


def reference_completion(model, tokenizer, task, prompt_tokens: list[int], text: str, prompt_index: int,
                         temperature: float) -> Completion:
    """The reference answer as a completion of prompt_tokens, with the policy's log-probs of its tokens."""
    frame = task.prompt_format or ""
    if frame and not frame[-1].isspace() and not text[:1].isspace():
        text = " " + text  # a base model's frame ends "Answer:" and its answers start with a space
    ending = task.stop[0] if task.stop else None
    tokens = list(tokenizer.encode(text + ending if ending else text, add_special_tokens=False))
    if not ending:
        tokens.append(end_token_ids(tokenizer)[0])
    whole = mx.array([prompt_tokens + tokens])
    logprobs, _ = token_logprobs(model, whole, temperature)
    behaviour = logprobs[0, len(prompt_tokens) - 1:].tolist()
    return Completion(prompt_index, list(prompt_tokens), tokens, behaviour, "stop", text, guided=True)


def guide_groups(model, tokenizer, task, rows: list[dict], completions: list[Completion], scores: Scores,
                 group_size: int, temperature: float) -> tuple[list[Completion], Scores]:
    """Replace the last member of every all-wrong group by its row's reference answer, scored anew."""
    is_right = right(accuracy_values(task, rows, group_size, completions, scores)).reshape(len(rows), group_size)
    completions = list(completions)
    replaced = []  # (position in the step, row)
    for i, row in enumerate(rows):
        text = task.reference_answer(row)
        if is_right[i].any() or not text:
            continue
        at = (i + 1) * group_size - 1
        completions[at] = reference_completion(model, tokenizer, task, completions[at].prompt_tokens, text,
                                               completions[at].prompt_index, temperature)
        replaced.append((at, row))
    if not replaced:
        return completions, scores
    guided = [completions[at] for at, _ in replaced]
    rescored = score_completions(task.reward_functions, task.reward_weights, [row["prompt"] for _, row in replaced],
                                 [c.text for c in guided], columns_of([row for _, row in replaced], 1, guided))
    positions = [at for at, _ in replaced]
    total = np.array(scores.total, dtype=np.float64)
    total[positions] = rescored.total
    parts = {name: list(values) for name, values in scores.parts.items()}
    for name, values in rescored.parts.items():
        for at, value in zip(positions, values):
            parts[name][at] = value
    errors = dict(scores.errors)
    for name, n in rescored.errors.items():
        errors[name] = errors.get(name, 0) + n
    return completions, Scores(total=total, parts=parts, errors=errors,
                               error_examples={**rescored.error_examples, **scores.error_examples})


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


def guided_metrics(task, completions: list[Completion], parts: dict[str, list], group_size: int) -> dict:
    """How many groups were guided, and the accuracy of the model's own samples (the reference left out)."""
    guided = np.array([c.guided for c in completions])
    values = parts.get(reward_name(task.accuracy_reward))
    metrics = {"guide/groups_frac": float(guided.reshape(-1, group_size).any(axis=1).mean())}
    if values is not None:
        metrics["guide/sampled_accuracy"] = float(right(values)[~guided].mean()) if (~guided).any() else 0.0
    return metrics
