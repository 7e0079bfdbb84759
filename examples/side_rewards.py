"""A crafted side reward for measuring --shaping (docs/rare-rewards.md).

Used with arith's own correctness reward as the main one:

    mlx-grpo train --task arith --reward-file examples/side_rewards.py \
        --reward correctness_reward --reward single_digit_reward --reward-weights 1,0.1

single_digit_reward pays for a one-digit final answer, a habit the model can pick
up without solving anything (SmolLM2-135M on GSM8K ended answering single
digits; docs/health.md): right for some arith problems, wrong for every answer above 9.
"""

from rewards import completion_text
from rewards.arith import correctness_reward, extract_answer  # noqa: F401 (the main reward, by name)


def single_digit_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 where the final '#### N' is a single digit, else 0.0."""
    answers = [extract_answer(completion_text(c)) for c in completions]
    return [1.0 if a is not None and len(a.lstrip("-")) == 1 else 0.0 for a in answers]
