"""The objective against an independent NumPy implementation, and gradients
against finite differences (through the tiny model: tests/test_losses_model.py)."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.update.losses import LOSS_TYPES, BatchShape, LossSettings, kl_k3, policy_loss, top_entropy_mask


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def numpy_loss(
    logp,
    old,
    adv,
    mask,
    loss_type,
    *,
    eps_low=0.2,
    eps_high=0.28,
    beta=0.0,
    ref=None,
    max_tokens=12,
    micro_batches=1,
    delta=None,
    tau_pos=1.0,
    tau_neg=1.05,
    entropy=None,
    entropy_coef=0.0,
    token_weight=None,
    logp_stopped=None,
    guided=None,
    guide_shaping=0.0,
):
    """Each paper's formula, written out in float64.

    One micro-batch = the whole batch, except for bnpo, which normalises by each
    micro-batch's own token count. logp_stopped stands for sg(logp) (CISPO's
    weight): the finite-difference gradient moves logp and leaves it fixed.
    """
    logp_stopped = logp if logp_stopped is None else logp_stopped
    a = adv[:, None]
    ratio = np.exp(logp - old)
    if loss_type == "gspo":  # Zheng et al. 2025, eq. 5-7
        s = np.exp((mask * (logp - old)).sum(1) / mask.sum(1))[:, None]
        term = -np.minimum(s * a, np.clip(s, 1 - eps_low, 1 + eps_high) * a) * np.ones_like(logp)
    elif loss_type == "cispo":  # MiniMax 2025, eq. 4-5
        weight = np.minimum(np.exp(logp_stopped - old), 1 + eps_high)
        term = -weight * a * logp
    elif loss_type == "sapo":  # Gao et al. 2025, eq. 6-8
        tau = np.where(a > 0, tau_pos, tau_neg)
        term = -(4 / tau) * _sigmoid(tau * (ratio - 1)) * a
    else:  # PPO-clip, with the optional two-sided cap delta
        unclipped = np.minimum(ratio, delta) if delta is not None else ratio
        term = -np.minimum(unclipped * a, np.clip(ratio, 1 - eps_low, 1 + eps_high) * a)
    if guided is not None and guide_shaping > 0:  # LUFFY (Yan et al. 2025), eq. 6: f(p) = p / (p + gamma)
        p = np.exp(logp)
        term = np.where(guided[:, None], -a * p / (p + guide_shaping), term)
    if token_weight is not None:
        term = term * token_weight
    if beta > 0:
        term = term + beta * (np.exp(ref - logp) - (ref - logp) - 1)
    if entropy_coef > 0:
        term = term - entropy_coef * entropy
    if loss_type in ("grpo", "gspo", "sapo"):
        return np.mean([(term[i] * mask[i]).sum() / mask[i].sum() for i in range(len(adv))])
    if loss_type == "dr_grpo":
        return (term * mask).sum() / (len(adv) * max_tokens)
    if loss_type in ("dapo", "cispo"):
        return (term * mask).sum() / mask.sum()
    if loss_type == "bnpo":
        parts = np.array_split(np.arange(len(adv)), micro_batches)
        return np.mean([(term[p] * mask[p]).sum() / mask[p].sum() for p in parts])
    raise ValueError(loss_type)


def sequence_ratio(logp, old, mask):
    return np.exp((mask * (logp - old)).sum(1) / mask.sum(1))[:, None] * np.ones_like(logp)


def expected_clipped(logp, old, adv, mask, loss_type, eps_low=0.2, eps_high=0.28, delta=None):
    """Which tokens the clip should count (their policy gradient is cut, or, for CISPO, their weight)."""
    a = adv[:, None]
    ratio = sequence_ratio(logp, old, mask) if loss_type == "gspo" else np.exp(logp - old)
    if loss_type == "cispo":
        return (ratio > 1 + eps_high) * mask
    if loss_type == "sapo":
        return np.zeros_like(mask)
    clipped = ((ratio > 1 + eps_high) & (a > 0)) | ((ratio < 1 - eps_low) & (a < 0))
    if delta is not None:
        clipped |= (ratio > delta) & (a < 0)
    return clipped * mask


def random_inputs(seed, n=16, t=9):
    rng = np.random.default_rng(seed)
    old = rng.normal(-2.0, 1.0, (n, t))
    # Ratios spread well outside [0.8, 1.28], per token and per sequence, so both
    # clip branches fire for the token-level and the sequence-level losses.
    logp = old + rng.normal(0.0, 0.4, (n, t)) + rng.normal(0.0, 0.35, (n, 1))
    ref = old + rng.normal(0.0, 0.3, (n, t))
    adv = rng.normal(0.0, 1.0, n)
    mask = (rng.random((n, t)) < 0.75).astype(np.float64)
    mask[:, 0] = 1.0  # every sequence has at least one token
    entropy = rng.uniform(0.1, 3.0, (n, t))
    return logp, old, ref, adv, mask, entropy


def mlx_loss(logp, old, adv, mask, loss_type, micro=2, **kw):
    """Sum of the micro-batch losses, as the trainer accumulates them; the summed clip count; d loss / d
    logp."""
    n = len(adv)
    shape = BatchShape(
        num_sequences=n,
        num_tokens=int(mask.sum()),
        num_micro_batches=micro,
        max_tokens=kw.pop("max_tokens", 12),
    )
    settings = LossSettings(
        loss_type=loss_type,
        epsilon_low=kw.pop("eps_low", 0.2),
        epsilon_high=kw.pop("eps_high", 0.28),
        delta=kw.pop("delta", None),
        beta=kw.pop("beta", 0.0),
        sapo_tau_pos=1.0,
        sapo_tau_neg=1.05,
        entropy_coef=kw.pop("entropy_coef", 0.0),
        guide_shaping=kw.pop("guide_shaping", 0.0),
    )
    ref, entropy, weight = kw.pop("ref", None), kw.pop("entropy", None), kw.pop("token_weight", None)
    guided = kw.pop("guided", None)
    assert not kw, kw

    def f(arr):
        return mx.array(arr, dtype=mx.float32) if arr is not None else None

    def total(lp):
        loss, clipped = 0.0, 0.0
        for p in np.array_split(np.arange(n), micro):
            rows = mx.array(p)
            part_loss, stats = policy_loss(
                lp[rows],
                f(old[p]),
                f(adv[p]),
                f(mask[p]),
                shape,
                settings,
                ref_logp=f(ref[p]) if ref is not None else None,
                entropy=f(entropy[p]) if entropy is not None else None,
                token_weight=f(weight[p]) if weight is not None else None,
                guided=mx.array(guided[p]) if guided is not None else None,
            )
            loss = loss + part_loss
            clipped = clipped + stats["clipped"]
        return loss, clipped

    (loss, clipped), grad = mx.value_and_grad(total)(f(logp))
    return loss.item(), clipped.item(), np.array(grad)


def finite_difference_grad(fn, x, h=1e-6):
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[idx] = h
        grad[idx] = (fn(x + step) - fn(x - step)) / (2 * h)
    return grad


CASES = [(loss_type, beta) for loss_type in LOSS_TYPES for beta in (0.0, 0.05)]


@pytest.mark.parametrize("loss_type,beta", CASES)
def test_loss_and_gradient_match_the_paper_formula(loss_type, beta):
    logp, old, ref, adv, mask, _ = random_inputs(seed=LOSS_TYPES.index(loss_type) * 2 + int(beta > 0))
    micro = 2
    clipped_tokens = expected_clipped(logp, old, adv, mask, loss_type)
    if loss_type not in ("cispo", "sapo"):  # both clip sides fire on these inputs
        ratio = sequence_ratio(logp, old, mask) if loss_type == "gspo" else np.exp(logp - old)
        assert (clipped_tokens * (ratio > 1)).sum() > 0 and (clipped_tokens * (ratio < 1)).sum() > 0
    loss, clipped, grad = mlx_loss(logp, old, adv, mask, loss_type, micro=micro, beta=beta, ref=ref)

    def reference(lp):
        return numpy_loss(
            lp, old, adv, mask, loss_type, beta=beta, ref=ref, micro_batches=micro, logp_stopped=logp
        )

    assert loss == pytest.approx(reference(logp), rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(grad, finite_difference_grad(reference, logp), rtol=1e-3, atol=2e-6)
    assert np.abs(grad).max() > 1e-3  # a real gradient was compared
    assert clipped == clipped_tokens.sum()
    assert (clipped > 0) == (loss_type != "sapo")


def test_delta_caps_the_ratio_of_negative_advantage_tokens():
    logp, old, _, adv, mask, _ = random_inputs(seed=11)
    delta = 1.5
    ratio = np.exp(logp - old)
    capped = (ratio > delta) & (adv[:, None] < 0) & (mask > 0)
    assert capped.any()
    for loss_type in ("grpo", "dapo"):
        loss, clipped, grad = mlx_loss(logp, old, adv, mask, loss_type, delta=delta)

        def reference(lp, loss_type=loss_type):
            return numpy_loss(lp, old, adv, mask, loss_type, delta=delta, micro_batches=2)

        assert loss == pytest.approx(reference(logp), rel=1e-5, abs=1e-6)
        np.testing.assert_allclose(grad, finite_difference_grad(reference, logp), rtol=1e-3, atol=2e-6)
        assert clipped == expected_clipped(logp, old, adv, mask, loss_type, delta=delta).sum()
        assert np.all(grad[capped] == 0)  # the capped tokens get no gradient
        without, _, _ = mlx_loss(logp, old, adv, mask, loss_type)
        assert loss != pytest.approx(without)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_shaped_reference_tokens_match_luffys_formula(loss_type):
    """guide_shaping: a reference row's tokens take -A * p / (p + gamma), unclipped; the other rows are
    untouched."""
    logp, old, _, adv, mask, _ = random_inputs(seed=31)
    guided = np.zeros(len(adv), dtype=bool)
    guided[[3, 7, 12]] = True
    adv[guided] = np.abs(adv[guided]) + 0.5  # a reference is the right answer of its group
    gamma = 0.1
    loss, clipped, grad = mlx_loss(logp, old, adv, mask, loss_type, guided=guided, guide_shaping=gamma)

    def reference(lp):
        return numpy_loss(
            lp,
            old,
            adv,
            mask,
            loss_type,
            micro_batches=2,
            logp_stopped=logp,
            guided=guided,
            guide_shaping=gamma,
        )

    assert loss == pytest.approx(reference(logp), rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(grad, finite_difference_grad(reference, logp), rtol=1e-3, atol=2e-6)
    # a reference token's weight on grad(logp) is A * gamma * p / (p + gamma)^2: small where p is small
    if loss_type == "dr_grpo":
        p = np.exp(logp[guided])
        expected = -adv[guided][:, None] * gamma * p / (p + gamma) ** 2 * mask[guided] / (len(adv) * 12)
        np.testing.assert_allclose(grad[guided], expected, rtol=1e-4, atol=1e-9)
    sampled = ~guided[:, None] & (mask > 0)
    assert clipped == expected_clipped(logp, old, adv, mask, loss_type)[~guided].sum()
    off, _, grad_off = mlx_loss(logp, old, adv, mask, loss_type, guided=guided, guide_shaping=0.0)
    assert loss != pytest.approx(off)  # the shaping changed the reference rows...
    np.testing.assert_allclose(grad[sampled], grad_off[sampled], rtol=1e-6)  # ...and nothing else
    unguided, _, _ = mlx_loss(logp, old, adv, mask, loss_type)
    assert off == pytest.approx(unguided)  # gamma 0: the reference rows are trained like sampled ones


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo"])
def test_entropy_bonus_and_top_entropy_mask(loss_type):
    logp, old, _, adv, mask, entropy = random_inputs(seed=21)
    weight = np.array(
        top_entropy_mask(mx.array(entropy, dtype=mx.float32), mx.array(mask, dtype=mx.float32), 0.2)
    )
    # exactly the top 20% (rounded up) of the real tokens by entropy
    assert weight.sum() == np.ceil(0.2 * mask.sum())
    assert entropy[weight > 0].min() >= entropy[(mask > 0) & (weight == 0)].max()
    assert np.all(weight[mask == 0] == 0)
    loss, _, grad = mlx_loss(
        logp, old, adv, mask, loss_type, entropy=entropy, entropy_coef=0.01, token_weight=weight
    )

    def reference(lp):
        return numpy_loss(
            lp,
            old,
            adv,
            mask,
            loss_type,
            entropy=entropy,
            entropy_coef=0.01,
            token_weight=weight,
            micro_batches=2,
            logp_stopped=logp,
        )

    assert loss == pytest.approx(reference(logp), rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(grad, finite_difference_grad(reference, logp), rtol=1e-3, atol=2e-6)
    assert np.all(grad[weight == 0] == 0)  # masked-out tokens get no policy gradient


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_ratio_one_gives_reinforce_with_a_baseline(loss_type):
    """On-policy (num_iterations = 1, ratio 1) every objective's gradient is
    REINFORCE's, -A * grad(logp), under that loss's normalisation."""
    logp, _, _, adv, mask, _ = random_inputs(seed=5)
    _, clipped, grad = mlx_loss(logp, logp, adv, mask, loss_type, max_tokens=12)
    assert clipped == 0
    n, a = len(adv), adv[:, None]
    if loss_type in ("grpo", "gspo", "sapo"):
        expected = -a * mask / mask.sum(1, keepdims=True) / n
    elif loss_type == "dr_grpo":
        expected = -a * mask / (n * 12)
    elif loss_type == "bnpo":
        expected = np.concatenate(
            [-a[p] * mask[p] / mask[p].sum() / 2 for p in np.array_split(np.arange(n), 2)]
        )
    else:
        expected = -a * mask / mask.sum()
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("loss_type, shared_push", [("grpo", 0.1875), ("dr_grpo", 0.0), ("dapo", 0.0)])
def test_a_token_every_member_writes_nets_zero_only_without_a_per_sequence_mean(loss_type, shared_push):
    """Two episodes of one group open with the same call token, then one answers right after three more
    tokens (A = +0.5) and the other wrongly at once (A = -0.5). The shared token's net push is the sum of
    d loss / d logp over its two copies: grpo's per-sequence mean weighs the short wrong episode's copy
    4x, so the call both wrote is pushed down (-(0.5/4 - 0.5/1)/2); one divisor for all nets it to 0."""
    logp = np.log(np.full((2, 4), 0.5))
    mask = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=float)
    _, _, grad = mlx_loss(logp, logp, np.array([0.5, -0.5]), mask, loss_type, micro=1, max_tokens=4)
    assert grad[0, 0] + grad[1, 0] == pytest.approx(shared_push, abs=1e-7)


def test_k3_is_nonnegative_and_zero_at_equality():
    logp = mx.array([-1.0, -2.0, -3.0])
    assert np.allclose(np.array(kl_k3(logp, logp)), 0.0)
    ref = mx.array([-0.5, -2.5, -1.0])
    k3 = np.array(kl_k3(logp, ref))
    d = np.array(ref) - np.array(logp)
    np.testing.assert_allclose(k3, np.exp(d) - d - 1, rtol=1e-6)
    assert (k3 > 0).all()


def _sampled_and_reference_rows():
    """Row 0 sampled, row 1 a reference answer (--guide) the policy finds e^20 less likely than the reference
    model does: k3 there is about e^20, though row 1 says nothing about KL(pi || ref)."""
    logp = np.log(np.full((2, 3), 0.5))
    ref = logp + np.array([[0.1, -0.2, 0.3], [20.0, 20.0, 20.0]])
    d = ref[0] - logp[0]
    return logp, ref, np.ones((2, 3)), np.array([False, True]), float(np.mean(np.exp(d) - d - 1))


def test_the_kl_penalty_and_its_mean_leave_reference_rows_out():
    logp, ref, mask, guided, sampled_kl = _sampled_and_reference_rows()
    settings = LossSettings(
        loss_type="dr_grpo",
        epsilon_low=0.2,
        epsilon_high=0.28,
        delta=None,
        beta=0.1,
        sapo_tau_pos=1.0,
        sapo_tau_neg=1.05,
        entropy_coef=0.0,
        guide_shaping=0.0,
    )
    shape = BatchShape(num_sequences=2, num_tokens=6, num_micro_batches=1, max_tokens=3)
    f = lambda a: mx.array(a, dtype=mx.float32)  # noqa: E731

    def loss_and_kl(rows_guided):
        loss, stats = policy_loss(
            f(logp),
            f(logp),
            f([0.5, -0.5]),
            f(mask),
            shape,
            settings,
            ref_logp=f(ref),
            guided=mx.array(rows_guided),
        )
        return loss.item(), stats["kl"].item() / stats["kl_tokens"].item()

    loss, kl = loss_and_kl(guided)
    # ratio 1: each token's policy term is -A, and the two rows' cancel; the penalty is row 0's alone.
    assert loss == pytest.approx(0.1 * 3 * sampled_kl / (2 * 3), abs=1e-7)  # float32 sums
    assert kl == pytest.approx(sampled_kl, rel=1e-5)
    _, kl_if_sampled = loss_and_kl(np.array([False, False]))
    assert kl_if_sampled > 1e7  # what the reference row would have made of the mean


def test_the_watched_kl_leaves_reference_rows_out():
    from mlx_grpo.run.step_update import _kl_to_reference
    from mlx_grpo.update.batch import MicroBatch

    logp, ref, mask, guided, sampled_kl = _sampled_and_reference_rows()
    f = lambda a: mx.array(a, dtype=mx.float32)  # noqa: E731
    mb = MicroBatch(
        prompts=mx.array([[1, 2]]),
        left_padding=mx.array([0]),
        completions=mx.zeros((2, 3), mx.int32),
        mask=f(mask),
        behaviour_logp=f(logp),
        advantages=f([0.5, -0.5]),
        group_size=2,
        guided=mx.array(guided),
    )
    assert _kl_to_reference([mb], [f(ref)]) == pytest.approx(sampled_kl, rel=1e-5)
    only_reference = MicroBatch(**{**mb.__dict__, "guided": mx.array([True, True])})
    assert _kl_to_reference([only_reference], [f(ref)]) is None


def test_a_reference_row_past_exps_range_leaves_the_loss_and_its_gradient_finite():
    """exp(200) overflows float32: off the KL mask the log-ratio must be 0 before exp, not masked after it."""
    logp, ref, mask, guided, sampled_kl = _sampled_and_reference_rows()
    ref[1] = logp[1] + 200.0
    _, _, grad = mlx_loss(
        logp,
        logp,
        np.array([0.5, -0.5]),
        mask,
        "dr_grpo",
        micro=1,
        max_tokens=3,
        beta=0.1,
        ref=ref,
        guided=guided,
    )
    assert np.isfinite(grad).all()
    d = ref[0] - logp[0]
    np.testing.assert_allclose(grad[0], -0.5 / 6 + 0.1 * (1 - np.exp(d)) / 6, rtol=1e-4)
