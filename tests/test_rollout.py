"""Rollouts keep exact ids, behaviour log-probs that a forward pass reproduces,
and finish reasons; the same seed gives the same samples."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_grpo.tasks.data import encode_prompt

from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling.rollout import SamplingConfig, sample_completions
from mlx_grpo.update.logprobs import token_logprobs


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    return load_policy(str(tiny_model_path))


def _prompts(tokenizer):
    return [encode_prompt(tokenizer, q) for q in ("what is 2+3?", "add 17 and 5", "hi")]


def _sample(policy, temperature=0.8, seed=0, max_tokens=12, **kw):
    model, tokenizer = policy
    mx.random.seed(seed)
    return sample_completions(
        model,
        tokenizer,
        _prompts(tokenizer),
        4,
        SamplingConfig(temperature=temperature, max_tokens=max_tokens, **kw),
    )


def test_groups_ids_text_and_finish_reasons(policy):
    _, tokenizer = policy
    completions = _sample(policy)
    assert [c.prompt_index for c in completions] == [0] * 4 + [1] * 4 + [2] * 4
    prompts = _prompts(tokenizer)
    end = tokenizer.eos_token_id
    for c in completions:
        assert c.prompt_tokens == prompts[c.prompt_index]
        assert len(c.tokens) == len(c.logprobs) >= 1
        if c.finish_reason == "stop":
            assert c.tokens[-1] == end and end not in c.tokens[:-1]
            body = c.tokens[:-1]
        else:
            assert c.finish_reason == "length" and len(c.tokens) == 12 and end not in c.tokens
            body = c.tokens
        assert c.text == tokenizer.decode(body)
    # a random model samples diverse completions within a group
    assert len({tuple(c.tokens) for c in completions[:4]}) > 1


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_behaviour_logprobs_match_a_forward_pass(policy, temperature):
    model, _ = policy
    for c in _sample(policy, temperature=temperature, seed=3):
        sequence = mx.array([c.prompt_tokens + c.tokens])
        logp, _ = token_logprobs(model, sequence, temperature=temperature)
        forward = np.array(logp[0, len(c.prompt_tokens) - 1 :])
        np.testing.assert_allclose(np.array(c.logprobs), forward, atol=2e-4)


def test_same_seed_same_samples_different_seed_different(policy):
    a = _sample(policy, seed=11)
    b = _sample(policy, seed=11)
    c = _sample(policy, seed=12)
    assert [x.tokens for x in a] == [x.tokens for x in b]
    assert [x.tokens for x in a] != [x.tokens for x in c]


def test_greedy_is_deterministic_and_scores_argmax(policy):
    model, _ = policy
    completions = _sample(policy, temperature=0.0, seed=1)
    again = _sample(policy, temperature=0.0, seed=2)
    assert [x.tokens for x in completions] == [x.tokens for x in again]
    c = completions[0]
    logits = model(mx.array([c.prompt_tokens + c.tokens[:-1]]))[0, len(c.prompt_tokens) - 1 :]
    assert np.array(mx.argmax(logits, axis=-1)).tolist() == c.tokens


def test_top_k_one_equals_greedy(policy):
    greedy = _sample(policy, temperature=0.0)
    top1 = _sample(policy, temperature=1.0, top_k=1, seed=5)
    assert [x.tokens for x in greedy] == [x.tokens for x in top1]
