"""Pieces of the training loop: batching, skipping silent groups, data order."""

import warnings

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from mlx_grpo.config import build_config
from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.trainer import make_optimizer, update_settings
from mlx_grpo.update.step import update
from mlx_grpo.sampling.rollout import Completion
from mlx_grpo.update.batch import (
    batch_rows,
    build_batch,
    groups_with_signal,
    micro_batch_count,
    micro_batches,
    prompt_runs,
)
from mlx_grpo.update.logprobs import logprobs_after_prompt
from mlx_grpo.update.losses import BatchShape, policy_loss


def _completions(rng, n_groups, g):
    out = []
    for i in range(n_groups):
        prompt = [int(t) for t in rng.integers(3, 250, 3 + i)]
        for _ in range(g):
            k = int(rng.integers(1, 6))
            out.append(
                Completion(
                    i,
                    prompt,
                    [int(t) for t in rng.integers(3, 250, k)],
                    list(rng.normal(-3, 0.5, k)),
                    "length",
                    "",
                )
            )
    return out


def _tiny_with_adapters(tiny_model_path):
    """The tiny model with fresh LoRA adapters of rank 4, seeded: the same starting weights every call."""
    model, _ = load_policy(str(tiny_model_path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4})
    return model


def test_build_batch_layout():
    rng = np.random.default_rng(0)
    comps = _completions(rng, 2, 3)
    batch = build_batch(comps, np.arange(6.0), 3)
    assert batch.prompts == [comps[0].prompt_tokens, comps[3].prompt_tokens]
    for i, c in enumerate(comps):
        k = len(c.tokens)
        assert batch.completions[i, :k].tolist() == c.tokens
        assert batch.mask[i].sum() == k
        np.testing.assert_allclose(batch.behaviour_logp[i, :k], c.logprobs, rtol=1e-6)
    parts = micro_batches(batch, 4)  # 4 sequences -> whole groups of 3: one group each
    assert len(parts) == 2 and parts[0].completions.shape[0] == 3
    # left padding: the shorter prompt is right-aligned
    assert parts[0].prompts.shape == (1, 3) and parts[0].left_padding.tolist() == [0]


def test_skipping_silent_groups_changes_nothing(tiny_model_path):
    rng = np.random.default_rng(1)
    comps = _completions(rng, 4, 3)
    advantages = np.array([0, 0, 0, 0.5, -0.25, -0.25, 0, 0, 0, 1.0, -0.5, -0.5])
    batch = build_batch(comps, advantages, 3)
    config = build_config(
        {
            "group_size": 3,
            "lr": 1e-2,
            "num_iterations": 2,
            "micro_batch_size": 3,
            "warmup_steps": 0,
            "steps": 5,
        }
    )
    all_parts = micro_batches(batch, 3)
    sizes = BatchShape(12, int(batch.mask.sum()), len(all_parts), config.sampling.max_tokens)
    results = []
    for parts in (all_parts, micro_batches(groups_with_signal(batch), 3)):
        model = _tiny_with_adapters(tiny_model_path)
        metrics = update(model, make_optimizer(config), update_settings(config), sizes, parts, None, None)
        results.append((dict(tree_flatten(model.trainable_parameters())), metrics))
    assert len(micro_batches(groups_with_signal(batch), 3)) == 2
    (a, ma), (b, mb) = results
    for name in a:
        np.testing.assert_allclose(np.array(a[name]), np.array(b[name]), atol=1e-6, err_msg=name)
    assert abs(ma["loss"] - mb["loss"]) < 1e-6 and abs(ma["grad_norm"] - mb["grad_norm"]) < 1e-5


def test_groups_cut_into_pieces_cover_every_row_once():
    rng = np.random.default_rng(2)
    batch = build_batch(_completions(rng, 3, 5), rng.normal(size=15), 5)
    for size in (1, 2, 3, 4):
        parts = micro_batches(batch, size)
        assert len(parts) == micro_batch_count(3, 5, size)
        assert all(
            0 < p.completions.shape[0] == p.group_size <= size and p.prompts.shape[0] == 1 for p in parts
        )
        np.testing.assert_array_equal(
            np.concatenate([np.array(p.advantages) for p in parts]), batch.advantages
        )
    assert [p.group_size for p in micro_batches(batch, 2)] == [2, 1, 2] * 3
    assert micro_batch_count(3, 5, 16) == 1 and micro_batch_count(7, 5, 10) == 4


def test_pieces_of_groups_train_exactly_like_whole_groups(tiny_model_path):
    """Cutting a group into pieces (less memory) changes no number.

    The pieces share one prompt pass; the gradient that reaches the weights
    through the prompt's keys and values is summed over the pieces (gradients.py).
    """
    rng = np.random.default_rng(3)
    comps = _completions(rng, 2, 4)
    batch = build_batch(comps, rng.normal(size=8), 4)
    assert [p.piece_of for p in micro_batches(batch, 3)] == [0, 0, 1, 1]
    assert [p.piece_of for p in micro_batches(batch, 16)] == [None]
    assert prompt_runs(micro_batches(batch, 3)) == [range(0, 2), range(2, 4)]
    assert prompt_runs(micro_batches(batch, 4)) == [range(0, 1), range(1, 2)]  # whole groups: one each
    for loss, extra in (("grpo", {}), ("dapo", {}), ("grpo", {"entropy_coef": 0.1})):
        config = build_config({"group_size": 4, "loss": loss, "steps": 5, **extra})
        results = []
        for size in (16, 3, 1):
            parts = micro_batches(batch, size)
            sizes = BatchShape(
                8, int(batch.mask.sum()), micro_batch_count(2, 4, size), config.sampling.max_tokens
            )
            model = _tiny_with_adapters(tiny_model_path)
            # Plain SGD: the weights move by the (clipped) gradient itself; Adam would
            # blow rounding-level differences in near-zero gradients up to lr.
            metrics = update(
                model, optim.SGD(learning_rate=1.0), update_settings(config), sizes, parts, None, None
            )
            results.append((dict(tree_flatten(model.trainable_parameters())), metrics))
        (whole, m_whole), *cut = results
        assert m_whole["update/rel_change"] > 0
        for weights, metrics in cut:
            for name in whole:
                np.testing.assert_allclose(
                    np.array(weights[name]), np.array(whole[name]), atol=1e-6, err_msg=name
                )
            assert abs(metrics["loss"] - m_whole["loss"]) < 1e-5


def _gradients_of(model, parts, refs, sizes, config):
    """(loss, stats, gradients) of each micro-batch as gradients.micro_batch_gradients gives them, as
    floats."""
    from mlx_grpo.update import gradients

    settings = update_settings(config)

    def after_prompt(model, state, mb):
        return logprobs_after_prompt(
            model, state, mb.left_padding, mb.completions, mb.group_size, 1.0, None, differentiated=True
        )

    def loss_of(logp, entropy, mb, ref):
        return policy_loss(
            logp, mb.behaviour_logp, mb.advantages, mb.mask, sizes, settings.loss, ref_logp=ref
        )

    return [
        (float(loss), {k: float(v) for k, v in stats.items()}, {k: np.array(v) for k, v in tree_flatten(g)})
        for loss, stats, g in gradients.micro_batch_gradients(model, parts, refs, after_prompt, loss_of)
    ]


def _assert_same_gradients(expected, got):
    assert len(got) == len(expected)
    for (loss, stats, grads), (loss_c, stats_c, grads_c) in zip(expected, got):
        assert abs(loss - loss_c) <= 1e-6 * max(1.0, abs(loss)) and stats.keys() == stats_c.keys()
        for k in stats:
            assert abs(stats[k] - stats_c[k]) <= 1e-5 * max(1.0, abs(stats[k])), k
        assert grads.keys() == grads_c.keys()
        for name in grads:
            np.testing.assert_allclose(grads_c[name], grads[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_compiled_gradients_equal_traced_ones(tiny_model_path, cpu_device, monkeypatch):
    """On a CPU each piece's value-and-gradient is compiled whole (gradients.py); the numbers are the traced
    ones.

    bnpo's token count is both a statistic and the loss's divisor (MLX's compile fails on such an output
    unless the statistics leave as one array). Two pieces of the same shape (rows of equal length) each get
    their own gradient: a compiled trace reused across pieces would hold the first piece's arrays."""
    from mlx_grpo.update import gradients

    rng = np.random.default_rng(5)
    comps = _completions(rng, 2, 4)
    for c in comps[:2]:  # the first group's first two rows: the same length, different tokens and advantages
        c.tokens, c.logprobs = c.tokens[:1] + [7, 9, 11], [-3.0] * 4
    batch = build_batch(comps, rng.normal(size=8), 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the traced path
        for loss, beta, size in (
            ("grpo", 0.04, 16),
            ("grpo", 0.04, 1),
            ("bnpo", 0.0, 16),
            ("dr_grpo", 0.0, 1),
        ):
            parts = micro_batches(batch, size)
            refs = (
                [mx.array(rng.normal(-3, 0.5, mb.mask.shape).astype(np.float32)) for mb in parts]
                if beta
                else None
            )
            config = build_config({"group_size": 4, "steps": 5, "loss": loss, "beta": beta})
            sizes = BatchShape(8, int(batch.mask.sum()), len(parts), config.sampling.max_tokens)
            model = _tiny_with_adapters(tiny_model_path)
            results = {}
            for compiled in (False, True):
                monkeypatch.setattr(gradients, "COMPILE_ON_CPU", compiled)
                results[compiled] = _gradients_of(model, parts, refs, sizes, config)
            assert len(results[True]) == (1 if size == 16 else 8 + 2)  # 8 pieces and a prompt share per group
            _assert_same_gradients(results[False], results[True])
            if size == 1:  # the two same-shape pieces: different gradients
                first, second = (results[True][i][2] for i in (0, 1))
                assert any(not np.allclose(first[n], second[n]) for n in first)


def test_a_failed_compile_leaves_the_weights_whole_and_runs_traced(tiny_model_path, cpu_device, monkeypatch):
    """A trace that fails midway leaves placeholders in the model; the weights come back, the piece runs
    traced."""
    from mlx_grpo.update import gradients

    rng = np.random.default_rng(6)
    batch = build_batch(_completions(rng, 2, 4), rng.normal(size=8), 4)
    parts = micro_batches(batch, 1)
    config = build_config({"group_size": 4, "steps": 5})
    sizes = BatchShape(8, int(batch.mask.sum()), len(parts), config.sampling.max_tokens)
    model = _tiny_with_adapters(tiny_model_path)
    weights = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    monkeypatch.setattr(gradients, "COMPILE_ON_CPU", False)
    traced = _gradients_of(model, parts, None, sizes, config)
    real_compile = mx.compile

    def failing_compile(fn, **kwargs):
        def traced_then_failed(*args):
            fn(*args)  # the model now holds the trace's placeholders
            raise RuntimeError("a compile bug")

        return real_compile(traced_then_failed, **kwargs)

    monkeypatch.setattr(gradients, "COMPILE_ON_CPU", True)
    monkeypatch.setattr(mx, "compile", failing_compile)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallen_back = _gradients_of(model, parts, None, sizes, config)
    assert any("a compile bug" in str(w.message) for w in caught)
    _assert_same_gradients(traced, fallen_back)
    for k, v in tree_flatten(model.parameters()):
        np.testing.assert_array_equal(np.array(v), weights[k], err_msg=k)


def test_pieces_run_their_prompt_once_unless_dropout_is_on(tiny_model_path, monkeypatch):
    from mlx_grpo.update import gradients

    rng = np.random.default_rng(3)
    batch = build_batch(_completions(rng, 2, 4), rng.normal(size=8), 4)
    parts = micro_batches(batch, 1)  # 2 groups x 4 pieces of one row
    config = build_config({"group_size": 4, "steps": 5})
    sizes = BatchShape(8, int(batch.mask.sum()), len(parts), config.sampling.max_tokens)
    calls = []
    counted = gradients.prompt_pass
    monkeypatch.setattr(gradients, "prompt_pass", lambda *a: calls.append(1) or counted(*a))
    for dropout, passes in (
        (0.0, 2 * 2),
        (0.5, 8),
    ):  # once for the state + once back, per group; or once a piece
        calls.clear()
        model, _ = load_policy(str(tiny_model_path))
        prepare_for_training(model, "lora", {"rank": 4, "dropout": dropout})
        model.train()
        update(model, optim.SGD(learning_rate=0.1), update_settings(config), sizes, parts, None, None)
        assert len(calls) == passes, dropout


def test_batch_rows_cover_each_epoch_once_in_a_seeded_order():
    rows = [{"prompt": str(i)} for i in range(10)]
    seen = [r["prompt"] for step in range(1, 6) for r in batch_rows(rows, step, 2, seed=3)]
    assert sorted(seen) == sorted(r["prompt"] for r in rows)  # one full pass, no repeats
    assert seen == [r["prompt"] for step in range(1, 6) for r in batch_rows(rows, step, 2, seed=3)]
    assert seen != [r["prompt"] for step in range(1, 6) for r in batch_rows(rows, step, 2, seed=4)]


def test_activation_estimate_and_budget_by_hand(cpu_device):  # the budget is the CPU backend's
    from types import SimpleNamespace

    from mlx_grpo.update import batch as batching

    smollm2 = SimpleNamespace(args=SimpleNamespace(hidden_size=576, num_hidden_layers=30, vocab_size=49152))
    assert batching.activation_bytes_per_position(smollm2) == 4 * (24 * 576 * 30 + 4 * 49152) == 2_445_312
    # 384 MiB over 48 positions of 2,445,312 bytes: 3 rows; the configured 16 only when it fits.
    assert batching.memory_bound_size(16, smollm2, 48) == 402_653_184 // (2_445_312 * 48) == 3
    assert batching.memory_bound_size(2, smollm2, 48) == 2
    assert batching.memory_bound_size(16, smollm2, 10**6) == 1  # never below one row
    assert batching.memory_bound_size(16, SimpleNamespace(), 64) == 16  # shape unknown: as configured


def test_train_step_cuts_micro_batches_to_the_cpu_budget_and_trains_the_same(
    tiny_model_path, monkeypatch, cpu_device
):
    """Under a one-position budget every micro-batch is one row; the step's weights are those of whole
    groups (micro-batching is exact). bnpo, whose objective depends on the micro-batch, is never cut."""
    from mlx_grpo.run import step_update, trainer
    from mlx_grpo.tasks.registry import Task
    from mlx_grpo.update import batch as batching

    task = Task(
        name="t",
        train_rows=[{"prompt": "ab"}, {"prompt": "cd"}],
        eval_rows=[],
        reward_functions=[lambda prompts, completions, **kw: [len(c) / 10 for c in completions]],
        reward_weights=[1.0],
        system_prompt=None,
        accuracy_reward=None,
        warnings=[],
    )
    sizes = []
    cut = step_update.micro_batches
    monkeypatch.setattr(
        step_update, "micro_batches", lambda b, size, *rest: sizes.append(size) or cut(b, size, *rest)
    )

    def one_step(loss, budget):
        monkeypatch.setattr(batching, "CPU_ACTIVATION_BUDGET", budget)
        config = build_config(
            {
                "group_size": 4,
                "batch_size": 2,
                "max_tokens": 6,
                "loss": loss,
                "kl_every": 0,
                "micro_batch_size": 16,
                "seed": 1,
            }
        )
        model, tokenizer = load_policy(str(tiny_model_path))
        mx.random.seed(0)
        prepare_for_training(model, "lora", {"rank": 4})
        trainer.train_step(model, tokenizer, optim.SGD(learning_rate=1.0), task, config, 1, None)
        return dict(tree_flatten(model.trainable_parameters()))

    whole = one_step("grpo", 2**40)
    per_position = batching.activation_bytes_per_position(load_policy(str(tiny_model_path))[0])
    rows = one_step("grpo", per_position)
    assert sizes == [16, 1]
    for name in whole:
        np.testing.assert_allclose(np.array(rows[name]), np.array(whole[name]), atol=1e-6, err_msg=name)
    assert any(np.abs(np.array(v)).max() > 0 for k, v in whole.items() if "lora_b" in k)  # it did train
    one_step("bnpo", per_position)
    assert sizes[-1] == 16
