"""Paired statistics against hand-worked values, brute force, and scipy where installed."""

import itertools
import math

import numpy as np
import pytest

from mlx_grpo.stats import (
    _signed_rank_distribution,
    bootstrap_ci,
    compare_paired,
    mcnemar_test,
    mean_pass_at_k,
    pass_at_k,
    sign_test,
    wilcoxon_test,
)


def test_mcnemar_exact_by_hand():
    # 1 vs 9 discordant prompts: 2 * (C(10,0) + C(10,1)) / 2^10
    assert mcnemar_test(1, 9) == pytest.approx(22 / 1024, abs=1e-15)
    assert mcnemar_test(9, 1) == mcnemar_test(1, 9)
    assert mcnemar_test(0, 0) == 1.0
    assert mcnemar_test(5, 5) == 1.0
    # 0 vs 5: 2 / 32
    assert mcnemar_test(0, 5) == pytest.approx(0.0625)


def test_mcnemar_exact_stays_exact_for_large_counts():
    # 0.5 ** 2000 underflows in floats; the integer arithmetic must not
    p = mcnemar_test(900, 1100)
    assert 0 < p < 1e-5
    assert mcnemar_test(1000, 1000) == 1.0


def test_mcnemar_chi2_by_hand():
    # (|1 - 9| - 1)^2 / 10 = 4.9; chi-square(1) survival = erfc(sqrt(4.9 / 2))
    assert mcnemar_test(1, 9, exact=False) == pytest.approx(math.erfc(math.sqrt(2.45)))
    assert mcnemar_test(1, 9, exact=False) == pytest.approx(0.026857, abs=1e-6)
    assert mcnemar_test(3, 4, exact=False) == 1.0  # |b - c| - 1 = 0
    assert mcnemar_test(0, 0, exact=False) == 1.0


def test_sign_test_by_hand():
    assert sign_test([1, 2, 0.5, 3, 1]) == pytest.approx(2 / 32)  # 5 of 5 up
    assert sign_test([1, -1, 0, 0]) == 1.0  # zeros are left out
    assert sign_test([0, 0, 0]) == 1.0
    # 1 down, 6 up: 2 * (1 + 7) / 128
    assert sign_test([-1, 1, 1, 1, 1, 1, 1]) == pytest.approx(16 / 128)


def test_signed_rank_distribution_matches_brute_force():
    for n in (1, 4, 7):
        brute = np.zeros(n * (n + 1) // 2 + 1, dtype=int)
        for signs in itertools.product((0, 1), repeat=n):
            brute[sum(r for r, s in zip(range(1, n + 1), signs) if s)] += 1
        assert list(_signed_rank_distribution(n)) == list(brute)


def test_wilcoxon_exact_by_hand():
    # ranks 1..5, W+ = 1+2+3+5 = 11, W- = 4; of 32 sign patterns, 7 have W+ <= 4
    # ({}, {1}, {2}, {3}, {4}, {1,2}, {1,3}), so p = 2 * 7 / 32
    result = wilcoxon_test([1, 2, 3, -4, 5])
    assert (result.statistic, result.method, result.n) == (4.0, "exact", 5)
    assert result.p_value == pytest.approx(14 / 32)
    assert wilcoxon_test([0, 0, 0]).p_value == 1.0


def test_wilcoxon_normal_with_ties_by_hand():
    # |d| = 1,1,2,2 -> ranks 1.5,1.5,3.5,3.5; W+ = 8.5, W- = 1.5
    # mean 4*5/4 = 5; variance 4*5*9/24 - (2^3-2 + 2^3-2)/48 = 7.5 - 0.25
    result = wilcoxon_test([1, -1, 2, 2])
    assert result.method == "normal" and result.statistic == 1.5
    z = (1.5 - 5) / math.sqrt(7.25)
    assert result.p_value == pytest.approx(math.erfc(abs(z) / math.sqrt(2)))
    with pytest.raises(ValueError):
        wilcoxon_test([1, -1, 2, 2], method="exact")


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 6, 5) == 1.0  # only 4 wrong: any 5 include a right one
    assert mean_pass_at_k([0, 2, 5], 5, 2) == pytest.approx((0 + 0.7 + 1) / 3)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_pass_at_k_matches_sampling_without_replacement():
    rng = np.random.default_rng(0)
    samples = np.array([1] * 3 + [0] * 5)
    draws = [samples[rng.permutation(8)[:3]].max() for _ in range(20000)]
    assert pass_at_k(8, 3, 3) == pytest.approx(np.mean(draws), abs=0.01)


def test_bootstrap_ci():
    assert bootstrap_ci([0.0] * 50) == (0.0, 0.0)
    assert bootstrap_ci([0.25] * 10) == pytest.approx((0.25, 0.25))
    assert bootstrap_ci([]) is None
    d = np.random.default_rng(1).normal(0.3, 1.0, size=400)
    low, high = bootstrap_ci(d)
    # the normal-theory interval mean +- 1.96 sd / sqrt(n)
    half = 1.96 * d.std(ddof=1) / math.sqrt(len(d))
    assert low == pytest.approx(d.mean() - half, abs=0.02)
    assert high == pytest.approx(d.mean() + half, abs=0.02)
    assert bootstrap_ci(d, seed=3) == bootstrap_ci(d, seed=3)  # reproducible


def test_compare_paired_identical_is_zero_and_not_significant():
    scores = [1.0, 0.0, 1.0, 1.0, 0.0] * 20
    r = compare_paired(scores, scores, "accuracy")
    assert r.difference == 0.0 and r.ci == (0.0, 0.0)
    assert r.p_value == 1.0 and not r.significant
    assert (r.wins, r.losses, r.ties) == (0, 0, 100)
    assert r.test == "mcnemar-exact"
    rewards = np.linspace(0, 1, 30)
    r = compare_paired(rewards, rewards, "reward")
    assert r.test.startswith("wilcoxon") and r.p_value == 1.0 and r.difference == 0.0


def test_compare_paired_counts_and_binary_test():
    base = [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]
    trained = [1, 1, 1, 1, 1, 1, 0, 1, 1, 0]
    r = compare_paired(base, trained, "accuracy")
    assert (r.wins, r.losses, r.ties) == (6, 1, 3)
    assert r.test == "mcnemar-exact"
    assert r.p_value == pytest.approx(mcnemar_test(1, 6))
    assert r.difference == pytest.approx(0.5)
    assert r.ci[0] <= 0.5 <= r.ci[1]
    strong = compare_paired([0] * 60 + [1] * 40, [1] * 100, "accuracy")
    assert strong.significant and strong.p_value == pytest.approx(2 / 2**60)
    # per-prompt means of several samples are not binary: Wilcoxon
    r = compare_paired([0.5, 0.25, 0.0], [1.0, 0.5, 0.75])
    assert r.test == "wilcoxon-exact"


def test_against_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    untied = rng.normal(0.2, 1.0, size=30)
    ours, theirs = wilcoxon_test(untied), scipy_stats.wilcoxon(untied, method="exact")
    assert ours.method == "exact"
    assert ours.statistic == pytest.approx(theirs.statistic)
    assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-9)
    tied = rng.integers(-3, 5, size=80).astype(float)  # ties and zeros
    ours = wilcoxon_test(tied)
    theirs = scipy_stats.wilcoxon(tied, zero_method="wilcox", correction=False, method="approx")
    assert ours.method == "normal"
    assert ours.statistic == pytest.approx(theirs.statistic)
    assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-9)
    assert mcnemar_test(3, 12) == pytest.approx(scipy_stats.binomtest(3, 15).pvalue, rel=1e-12)
    assert mcnemar_test(30, 52, exact=False) == pytest.approx(scipy_stats.chi2.sf(21**2 / 82, 1), rel=1e-9)
    d = rng.normal(0.1, 1.0, size=60)
    up, down = int((d > 0).sum()), int((d < 0).sum())
    assert sign_test(d) == pytest.approx(scipy_stats.binomtest(up, up + down).pvalue, rel=1e-12)
