"""Paired statistics for "does model B beat model A on the same prompts?".

Both models answer the same n prompts, so each prompt gives one paired
difference d_i = B_i - A_i (B: the trained model, A: the base). Everything
here works on those pairs:

  bootstrap_ci        percentile bootstrap CI of the mean difference
                      (prompts resampled with replacement)
  mcnemar_test        binary success (right/wrong per prompt): only the
                      discordant prompts count; exact binomial or chi-square
  sign_test           any score: how many prompts went up vs down
  wilcoxon_test       any score: signed ranks of the non-zero differences
  pass_at_k           unbiased pass@k from n samples with c successes
  compare_paired      all of the above in one dict, the test chosen by the data

Only the standard library and NumPy; the tests check the numbers against
hand-worked values and, where it is installed, scipy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

CONFIDENCE = 0.95
# Below this many non-zero differences (and without tied magnitudes) the
# Wilcoxon p-value comes from the exact distribution; above, the normal one.
WILCOXON_EXACT_MAX = 50


def _binomial_two_sided(k: int, n: int) -> float:
    """Two-sided p of k successes in n fair coin flips: 2 P(X <= min(k, n-k)), at most 1.

    Integer arithmetic: Python's int / int is correctly rounded, so this stays
    exact for any n (0.5**n alone would underflow past n = 1074).
    """
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1))
    return min(1.0, 2 * tail / 2**n)


def _normal_two_sided(z: float) -> float:
    """2 P(Z > |z|) for a standard normal Z."""
    return math.erfc(abs(z) / math.sqrt(2.0))


def mcnemar_test(b: int, c: int, exact: bool = True) -> float:
    """p-value of McNemar's test from the two discordant counts.

    b: prompts only the first model got right; c: only the second. Prompts both
    got right (or wrong) say nothing about which is better and are left out.
    exact: binomial test of b against b + c flips (valid for any counts);
    otherwise chi2 = (|b - c| - 1)^2 / (b + c) with 1 degree of freedom
    (the continuity-corrected approximation).
    """
    if exact:
        return _binomial_two_sided(b, b + c)
    if b + c == 0:
        return 1.0
    chi2 = max(abs(b - c) - 1, 0) ** 2 / (b + c)
    return math.erfc(math.sqrt(chi2 / 2.0))  # chi-square(1) survival function


def sign_test(differences) -> float:
    """Two-sided sign test: positives vs negatives among the non-zero differences."""
    d = np.asarray(differences, dtype=float)
    up, down = int((d > 0).sum()), int((d < 0).sum())
    return _binomial_two_sided(up, up + down)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, tied values sharing the mean of their ranks."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1  # positions i..j hold ranks i+1..j+1
        i = j + 1
    return ranks


def _signed_rank_distribution(n: int) -> np.ndarray:
    """counts[w] = how many of the 2^n sign patterns of ranks 1..n give W+ = w."""
    counts = np.zeros(n * (n + 1) // 2 + 1, dtype=object)  # exact integers, no overflow
    counts[0] = 1
    for r in range(1, n + 1):
        shifted = np.zeros_like(counts)
        shifted[r:] = counts[:-r]
        counts = counts + shifted
    return counts


@dataclass
class WilcoxonResult:
    statistic: float  # min(W+, W-), as scipy reports it
    p_value: float
    method: str  # "exact" or "normal"
    n: int  # non-zero differences used


def wilcoxon_test(differences, method: str = "auto") -> WilcoxonResult:
    """Two-sided Wilcoxon signed-rank test of paired differences.

    Zero differences are dropped first (Wilcoxon's own rule). Magnitudes that
    tie share their mean rank. "exact" counts sign patterns (only without
    tied magnitudes); "normal" uses the normal approximation with the tie
    correction of the variance and no continuity correction; "auto" takes
    exact up to WILCOXON_EXACT_MAX differences when there are no ties.
    """
    d = np.asarray(differences, dtype=float)
    d = d[d != 0]
    n = len(d)
    if n == 0:
        return WilcoxonResult(0.0, 1.0, "exact", 0)
    ranks = _ranks(np.abs(d))
    w_plus = float(ranks[d > 0].sum())
    w_minus = float(ranks[d < 0].sum())
    statistic = min(w_plus, w_minus)
    _, tie_sizes = np.unique(np.abs(d), return_counts=True)
    has_ties = bool((tie_sizes > 1).any())
    if method == "auto":
        method = "exact" if n <= WILCOXON_EXACT_MAX and not has_ties else "normal"
    if method == "exact":
        if has_ties:
            raise ValueError("the exact Wilcoxon distribution needs untied magnitudes")
        counts = _signed_rank_distribution(n)
        w = int(round(statistic))
        lower = sum(counts[: w + 1])  # P(W+ <= w) * 2^n; the distribution is symmetric
        return WilcoxonResult(statistic, min(1.0, 2 * lower / 2**n), "exact", n)
    if method != "normal":
        raise ValueError(f"method must be auto, exact or normal, not {method!r}")
    mean = n * (n + 1) / 4
    variance = n * (n + 1) * (2 * n + 1) / 24 - float((tie_sizes**3 - tie_sizes).sum()) / 48
    if variance <= 0:
        return WilcoxonResult(statistic, 1.0, "normal", n)
    return WilcoxonResult(statistic, _normal_two_sided((statistic - mean) / math.sqrt(variance)), "normal", n)


def bootstrap_ci(
    differences, confidence: float = CONFIDENCE, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean of paired differences (None when empty).

    Each resample draws n prompts with replacement and averages their
    differences; the CI is the middle `confidence` of those means. Seeded, so a
    report is reproducible.
    """
    d = np.asarray(differences, dtype=float)
    if len(d) == 0:
        return None
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 2_000_000 // len(d))  # bound the index matrix to ~16 MB
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        means[start : start + size] = d[rng.integers(0, len(d), size=(size, len(d)))].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: P(at least one of k draws without replacement from n samples is right).

    1 - C(n - c, k) / C(n, k), as a product so it never forms huge binomials.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(successes, n: int, k: int) -> float:
    """pass@k averaged over prompts; successes[i] = right samples of prompt i (of n)."""
    return float(np.mean([pass_at_k(n, int(c), k) for c in successes]))


@dataclass
class PairedResult:
    """B - A on the same prompts. wins: prompts where B scored higher."""

    metric: str
    mean_a: float
    mean_b: float
    difference: float
    ci: tuple[float, float] | None
    confidence: float
    test: str  # "mcnemar-exact", "wilcoxon-exact", "wilcoxon-normal"
    p_value: float
    wins: int
    losses: int
    ties: int
    n: int
    sign_test_p: float
    significant: bool  # p_value < 1 - confidence

    def to_dict(self) -> dict:
        out = asdict(self)
        out["ci"] = list(self.ci) if self.ci is not None else None
        return out


def compare_paired(
    a, b, metric: str = "score", binary: bool | None = None, confidence: float = CONFIDENCE, seed: int = 0
) -> PairedResult:
    """Paired comparison of per-prompt scores a (base) and b (trained).

    binary: each score is 0 or 1 (one sample per prompt, right or wrong): then
    McNemar's exact test; otherwise the Wilcoxon signed-rank test. None: decide
    from the values.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores need equal 1-d shapes, got {a.shape} and {b.shape}")
    d = b - a
    if binary is None:
        binary = bool(np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    if binary:
        test, p = "mcnemar-exact", mcnemar_test(losses, wins)
    else:
        w = wilcoxon_test(d)
        test, p = f"wilcoxon-{w.method}", w.p_value
    n = len(d)
    return PairedResult(
        metric=metric,
        mean_a=float(a.mean()) if n else 0.0,
        mean_b=float(b.mean()) if n else 0.0,
        difference=float(d.mean()) if n else 0.0,
        ci=bootstrap_ci(d, confidence, seed=seed),
        confidence=confidence,
        test=test,
        p_value=p,
        wins=wins,
        losses=losses,
        ties=n - wins - losses,
        n=n,
        sign_test_p=sign_test(d),
        significant=p < 1 - confidence,
    )


def compare_paired_part(
    a_values: list, b_values: list, samples: int, metric: str, seed: int = 0
) -> PairedResult | None:
    """compare_paired of a reward part whose values may be None (not applicable, e.g. a judge answer
    that was not a score): per prompt, the mean of its applicable samples; a prompt where either model
    has none is left out. None when no prompt is left."""

    def per_prompt(values):
        x = np.array([np.nan if v is None else v for v in values], dtype=float).reshape(-1, samples)
        counts = (~np.isnan(x)).sum(axis=1)
        return np.where(counts > 0, np.nansum(x, axis=1) / np.maximum(counts, 1), np.nan)

    a, b = per_prompt(a_values), per_prompt(b_values)
    both = ~np.isnan(a) & ~np.isnan(b)
    return compare_paired(a[both], b[both], metric, binary=False, seed=seed) if both.any() else None


# Reward parts that compare also tests, beside accuracy and the total: a judge's score is a
# learned reward, worth a test of its own, never the headline.
PAIRED_PARTS = ("judge",)


def paired_parts(a_parts: dict, b_parts: dict, samples: int, seed: int = 0) -> dict[str, PairedResult]:
    """compare_paired_part of each of PAIRED_PARTS that both models have and that leaves any prompt."""
    tested = {
        name: compare_paired_part(a_parts[name], b_parts[name], samples, name, seed)
        for name in PAIRED_PARTS
        if name in a_parts and name in b_parts
    }
    return {name: result for name, result in tested.items() if result is not None}
