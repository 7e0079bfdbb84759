"""Reward functions and tasks, one module per domain."""


def completion_text(completion) -> str:
    """Completion text from a plain string or from chat messages (last message's content).

    mlx-grpo passes strings; reward functions written for chat-shaped
    completions (lists of {"role", "content"}) get the same treatment.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, (list, tuple)) and completion:
        return completion_text(completion[-1])
    return ""
