"""A model's output head: the vocabulary projection that turns hidden states into logits.

Sampling and the log-prob passes both split a forward pass into `model.model` (hidden
states) and the head, so that the projection can run a chunk of positions at a time, or
only on the last position. That is exact only for models whose logits are exactly
head(model.model(inputs)); `output_head` says which, and gives their head.
"""

from __future__ import annotations

# Models whose logits are exactly head(model.model(inputs)): for these the
# output projection can be chunked. (gemma3_text's tied head is its embedding;
# Gemma 3 has no final logit softcapping, which would sit outside model.model.)
PLAIN_HEAD_MODEL_TYPES = {"qwen2", "qwen3", "llama", "mistral", "phi3", "olmo2", "smollm3", "gemma3_text"}


def output_head(model):
    """(module, projection) of a plain-head model, or None when its logits are not head(model.model(x)).

    `module` owns the weights (an `lm_head`, or the tied embedding); `projection` maps hidden
    states to logits (the head itself, or the embedding's `as_linear`).
    """
    if getattr(model, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    if hasattr(model, "lm_head"):
        return model.lm_head, model.lm_head
    embed = model.model.embed_tokens
    return embed, embed.as_linear
