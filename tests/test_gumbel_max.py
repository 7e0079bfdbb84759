"""The two-level Gumbel-max draw (rollout.gumbel_max) samples softmax(logits) exactly, row by row."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.sampling.rollout import BLOCK, SamplingConfig, draw_tokens, gumbel_max


def _keys(n: int, seed: int = 0) -> mx.array:
    return mx.random.split(mx.random.key(seed), n)


def _draws(logits: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """n draws from one row of logits, each with its own key, in one batch."""
    rows = mx.broadcast_to(mx.array(logits, dtype=mx.float32)[None], (n, len(logits)))
    tokens, _ = gumbel_max(rows, _keys(n, seed))
    return np.array(tokens)


@pytest.mark.parametrize("vocab", [300, 3 * BLOCK])  # padded to whole blocks, and not
def test_draws_follow_softmax_across_and_within_blocks(vocab):
    """Mass spread over several blocks, uneven inside each: the frequencies are softmax's, by chi-square."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1.5, vocab)
    logits[:5] += 4.0  # a head inside the first block, a long tail over the others
    p = np.exp(logits - logits.max())
    p /= p.sum()
    n = 40_000
    counts = np.bincount(_draws(logits, n), minlength=vocab)
    assert counts.sum() == n and len(counts) == vocab  # no draw falls in the padding
    # Pool the rare tokens so that every expected count is at least 5 (chi-square's condition).
    order = np.argsort(p)
    expected, observed, pooled_e, pooled_o = [], [], 0.0, 0
    for i in order:
        pooled_e += n * p[i]
        pooled_o += counts[i]
        if pooled_e >= 5:
            expected.append(pooled_e)
            observed.append(pooled_o)
            pooled_e, pooled_o = 0.0, 0
    expected[-1] += pooled_e
    observed[-1] += pooled_o
    expected, observed = np.array(expected), np.array(observed)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    dof = len(expected) - 1
    # Far in the tail of chi-square with dof degrees of freedom (mean dof, sd sqrt(2 dof)).
    assert chi2 < dof + 6 * np.sqrt(2 * dof), (chi2, dof)
    # The tail blocks really are drawn: more than a third of the mass lies outside the first block.
    assert counts[BLOCK:].sum() > n / 3


def test_the_normaliser_is_logsumexp_and_a_row_depends_on_its_key_alone():
    rng = np.random.default_rng(1)
    logits = mx.array(rng.normal(0, 2, (6, 1000)), dtype=mx.float32)
    keys = _keys(6, 3)
    tokens, normaliser = gumbel_max(logits, keys)
    np.testing.assert_allclose(np.array(normaliser), np.array(mx.logsumexp(logits, axis=-1)), rtol=1e-6)
    alone = [int(gumbel_max(logits[i : i + 1], keys[i : i + 1])[0].item()) for i in range(6)]
    assert alone == np.array(tokens).tolist()
    shuffled = [5, 2, 0, 4, 1, 3]  # other rows beside it, in another order: the same draw
    again = np.array(gumbel_max(logits[mx.array(shuffled)], keys[mx.array(shuffled)])[0])
    assert again.tolist() == [alone[i] for i in shuffled]


def test_a_shift_of_the_logits_changes_no_draw():
    """The fixed decoder draws from raw logits, mlx-lm's generator from log-probs: the same tokens."""
    rng = np.random.default_rng(2)
    logits = mx.array(rng.normal(0, 2, (64, 2000)), dtype=mx.float32)
    keys = _keys(64, 5)
    a = np.array(gumbel_max(logits, keys)[0])
    b = np.array(gumbel_max(logits - mx.logsumexp(logits, axis=-1, keepdims=True) + 3.0, keys)[0])
    assert (a == b).mean() >= 0.99  # a rounding-level change may move a near-tie, nothing more


def test_filtered_tokens_are_never_drawn_and_logprobs_are_unfiltered():
    rng = np.random.default_rng(3)
    logits = mx.array(rng.normal(0, 1, (512, 700)), dtype=mx.float32)
    sampling = SamplingConfig(temperature=0.9, top_k=3)
    tokens, logprobs = draw_tokens(logits, _keys(512, 7), sampling)
    top3 = np.argsort(-np.array(logits), axis=-1)[:, :3]
    assert all(t in row for t, row in zip(np.array(tokens), top3))
    scaled = np.array(logits, dtype=np.float64) / 0.9
    want = scaled[np.arange(512), np.array(tokens)] - np.log(np.exp(scaled).sum(axis=-1))
    np.testing.assert_allclose(np.array(logprobs), want, atol=1e-5)


def test_logprobs_without_filters_are_tempered_log_softmax():
    rng = np.random.default_rng(4)
    logits = mx.array(rng.normal(0, 3, (16, 151_936 // 8)), dtype=mx.float32)
    tokens, logprobs = draw_tokens(logits, _keys(16, 9), SamplingConfig(temperature=0.7))
    scaled = np.array(logits, dtype=np.float64) / 0.7
    want = (
        scaled[np.arange(16), np.array(tokens)]
        - np.log(np.exp(scaled - scaled.max(-1, keepdims=True)).sum(-1))
        - scaled.max(-1)
    )
    np.testing.assert_allclose(np.array(logprobs), want, atol=1e-5)
