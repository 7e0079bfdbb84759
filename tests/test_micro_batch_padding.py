"""A group cut into pieces puts its rows of similar length in the same piece, and every step logs
update/padded_frac, the share of the update's completion slots that is padding."""

import re

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from mlx_grpo.config import TrainConfig, build_config
from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.step_update import Trained, prepare_update, update_settings
from mlx_grpo.run.trainer import make_optimizer, train_step
from mlx_grpo.sampling.rollout import Completion
from mlx_grpo.tasks.registry import Task
from mlx_grpo.update.batch import batch_shape, build_batch, micro_batches, padded_fraction
from mlx_grpo.update.gradients import _varying, lowest_trained_layer, micro_batch_gradients
from mlx_grpo.update.logprobs import logprobs_after_prompt
from mlx_grpo.update.losses import BatchShape, policy_loss, same_at_any_cut
from tiny import build_tiny_model


def _completions(lengths: list[int], group_size: int, seed: int = 0) -> list[Completion]:
    """One completion of each length, `group_size` a group, each group with its own prompt."""
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(3, 250, 3 + g)] for g in range(len(lengths) // group_size)]
    return [
        Completion(
            i // group_size,
            prompts[i // group_size],
            [int(t) for t in rng.integers(3, 250, k)],
            list(rng.normal(-3, 0.5, k)),
            "stop",
            "",
        )
        for i, k in enumerate(lengths)
    ]


def _batch(lengths, group_size, advantages=None, seed=0):
    advantages = np.arange(1.0, len(lengths) + 1) if advantages is None else advantages
    return build_batch(_completions(lengths, group_size, seed), advantages, group_size)


def _lengths(parts) -> list[list[int]]:
    return [np.array(p.mask).sum(axis=1).astype(int).tolist() for p in parts]


def test_padded_fraction_of_a_hand_worked_batch():
    """Two groups of 2, lengths 3 1 | 2 4.
    One micro-batch of both groups: 4 rows x width 4 = 16 slots, 3+1+2+4 = 10 tokens: 6/16.
    One group each: 2 x 3 + 2 x 4 = 14 slots, 4 + 6 tokens: 4/14.
    The last row's mask 1 0 1 0 (a multi-turn row: its turn, the environment's token, its turn): the
    width drops to 3 (12 slots) and that row needs 3 of them, the environment's token included: (12-9)/12."""
    batch = _batch([3, 1, 2, 4], 2)
    assert padded_fraction(micro_batches(batch, 4)) == pytest.approx(6 / 16)
    assert padded_fraction(micro_batches(batch, 2)) == pytest.approx(4 / 14)
    batch.mask[3] = [1, 0, 1, 0]
    assert [p.mask.shape for p in micro_batches(batch, 4)] == [(4, 3)]
    assert padded_fraction(micro_batches(batch, 4)) == pytest.approx(3 / 12)
    assert padded_fraction([]) is None


def test_pieces_of_similar_length_pad_less():
    """One group of 4, lengths 2 6 1 5, pieces of 2 rows.
    In sampling order: (2, 6) 2 x 6 = 12 slots, 8 tokens; (1, 5) 2 x 5 = 10 slots, 6 tokens: 8/22.
    By length: (1, 2) 2 x 2 = 4 slots, 3 tokens; (5, 6) 2 x 6 = 12 slots, 11 tokens: 2/16."""
    batch = _batch([2, 6, 1, 5], 4)
    in_order, by_length = micro_batches(batch, 2), micro_batches(batch, 2, by_length=True)
    assert _lengths(in_order) == [[2, 6], [1, 5]] and _lengths(by_length) == [[1, 2], [5, 6]]
    assert padded_fraction(in_order) == pytest.approx(8 / 22)
    assert padded_fraction(by_length) == pytest.approx(2 / 16)
    # Each row's advantage and behaviour log-probs travel with it (advantage i+1 on the row of length
    # lengths[i]).
    assert [np.array(p.advantages).tolist() for p in by_length] == [[3.0, 1.0], [4.0, 2.0]]
    np.testing.assert_array_equal(np.array(by_length[1].behaviour_logp), batch.behaviour_logp[[3, 1], :6])
    assert [p.piece_of for p in by_length] == [0, 0]
    # Whole groups keep their rows as they are.
    assert _lengths(micro_batches(batch, 4, by_length=True)) == [[2, 6, 1, 5]]


def _loss_and_gradients(model, parts, sizes: BatchShape, loss_type: str):
    """The summed loss and gradients of one update's micro-batches, as update/step.py's update() takes
    them."""
    settings = update_settings(TrainConfig.from_flat({"loss": loss_type})).loss  # the defaults otherwise

    def after_prompt(model, state, mb):
        return logprobs_after_prompt(model, state, mb.left_padding, mb.completions, mb.group_size)

    def loss_of(logp, entropy, mb, ref):
        return policy_loss(logp, mb.behaviour_logp, mb.advantages, mb.mask, sizes, settings)

    total, grads = 0.0, None
    for loss, _, g in micro_batch_gradients(model, parts, None, after_prompt, loss_of):
        total += loss.item()
        grads = g if grads is None else tree_map(mx.add, grads, g)
    return total, {k: np.array(v) for k, v in tree_flatten(grads)}


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "gspo", "cispo"])
def test_sorted_pieces_train_like_the_whole_group(tiny_model_path, loss_type):
    """Two groups of 6 with lengths out of order, cut by length into pieces of 2: the loss and its
    gradient are those of both groups in one micro-batch."""
    batch = _batch(
        [5, 1, 4, 2, 6, 3, 2, 7, 1, 3, 5, 4], 6, advantages=np.random.default_rng(1).normal(size=12)
    )
    whole, pieces = micro_batches(batch, 12), micro_batches(batch, 2, by_length=True)
    assert _lengths(pieces) == [[1, 2], [3, 4], [5, 6], [1, 2], [3, 4], [5, 7]] and len(whole) == 1
    sizes = batch_shape(batch, 12, 8)
    model, _ = load_policy(str(tiny_model_path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4})
    model.train()
    loss_whole, grads_whole = _loss_and_gradients(model, whole, sizes, loss_type)
    loss_pieces, grads_pieces = _loss_and_gradients(model, pieces, sizes, loss_type)
    assert abs(loss_whole) > 1e-4 and max(np.abs(g).max() for g in grads_whole.values()) > 1e-6
    assert loss_pieces == pytest.approx(loss_whole, rel=1e-5, abs=1e-6)
    for name, g in grads_whole.items():
        np.testing.assert_allclose(grads_pieces[name], g, rtol=1e-4, atol=1e-6, err_msg=name)


def test_bnpo_counts_the_micro_batches_it_is_given():
    """Rows 0 and 2 of a group of 4 fully masked (mask_truncated): in order, pieces (0, 1) and (2, 3) both
    train; by length the two masked rows share a piece, which is dropped. batch_shape counts what
    micro_batches yields either way, and bnpo, whose token mean is per micro-batch, keeps sampling order."""
    batch = _batch([3, 2, 4, 1, 2, 5, 3, 1], 4)
    batch.mask[[0, 2]] = 0.0
    for by_length, count in ((False, 4), (True, 3)):
        assert len(micro_batches(batch, 2, by_length)) == count
        assert batch_shape(batch, 2, 8, by_length).num_micro_batches == count
    rng = np.random.default_rng(4)
    for _ in range(20):
        batch = _batch(list(rng.integers(1, 6, 12)), 6, seed=int(rng.integers(1000)))
        batch.mask[rng.random(12) < 0.4] = 0.0
        for size in (1, 2, 4, 6, 12):
            for by_length in (False, True):
                assert batch_shape(batch, size, 8, by_length).num_micro_batches == len(
                    micro_batches(batch, size, by_length)
                )
    assert not same_at_any_cut("bnpo") and all(
        same_at_any_cut(k) for k in ("grpo", "dapo", "dr_grpo", "gspo")
    )


def _task():
    return Task(
        "t",
        [{"prompt": p} for p in ("1+1", "2+2")],
        [],
        [lambda prompts, completions, **kw: [float(len(c)) for c in completions]],
        [1.0],
        None,
        None,
        [],
    )


@pytest.mark.parametrize("loss, lengths", [("grpo", [[1, 2], [5, 6]]), ("bnpo", [[2, 6], [1, 5]])])
def test_a_step_orders_pieces_by_length_unless_bnpo(tiny_model_path, loss, lengths):
    config = build_config({"group_size": 4, "micro_batch_size": 2, "loss": loss, "kl_every": 0, "steps": 2})
    model, _ = load_policy(str(tiny_model_path))
    trained = Trained(_completions([2, 6, 1, 5], 4), np.array([1.0, -1.0, 0.5, -0.5]), np.arange(4))
    ready = prepare_update(model, trained, _task(), config, 1, None)
    assert _lengths(ready.parts) == lengths
    assert ready.padded_frac == pytest.approx(2 / 16 if loss == "grpo" else 8 / 22)


def test_a_training_step_logs_the_padded_fraction(tiny_model_path):
    config = build_config(
        {"group_size": 4, "batch_size": 2, "micro_batch_size": 2, "max_tokens": 6, "kl_every": 0, "steps": 2}
    )
    model, tokenizer = load_policy(str(tiny_model_path))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4})
    metrics, _ = train_step(model, tokenizer, make_optimizer(config), _task(), config, 1, None)
    print(metrics["update/padded_frac"])
    assert 0.0 <= metrics["update/padded_frac"] < 1.0


def test_the_prompt_state_that_trained_weights_change():
    """A flat prompt state of 4 layers: keys 0-3, values 4-7, the last hidden state 8. With the lowest
    trained layer 3, keys 3, values 7 and the last state carry a gradient; with 0, all nine; with none
    trained (4), the last state alone."""
    assert _varying(9, 3) == [3, 7, 8]
    assert _varying(9, 0) == list(range(9))
    assert _varying(9, 4) == [8]


def test_lowest_trained_layer(tmp_path):
    path = str(build_tiny_model(tmp_path / "m", layers=4))
    for adapted, lowest in ((1, 3), (3, 1), (-1, 0)):
        model, _ = load_policy(path)
        prepare_for_training(model, "lora", {"rank": 2, "num_layers": adapted})
        assert lowest_trained_layer(model) == lowest
    model, _ = load_policy(path)
    prepare_for_training(model, "lora", {"rank": 2, "num_layers": 1})
    # a trained weight below every layer: none of their states is constant
    model.model.embed_tokens.unfreeze()
    assert lowest_trained_layer(model) == 0


@pytest.mark.parametrize("adapted_layers", [1, 2])
def test_pieces_with_adapters_on_the_top_layers_train_like_the_whole_group(tmp_path, adapted_layers):
    """Adapters on the top layers of 3: the pieces take no gradient for the prompt's state below them,
    and the loss and its gradient are still those of the whole group in one micro-batch."""
    batch = _batch([5, 1, 4, 2, 6, 3], 6, advantages=np.random.default_rng(2).normal(size=6))
    whole, pieces = micro_batches(batch, 6), micro_batches(batch, 2, by_length=True)
    sizes = batch_shape(batch, 6, 8)
    model, _ = load_policy(str(build_tiny_model(tmp_path / "m", layers=3)))
    mx.random.seed(0)
    prepare_for_training(model, "lora", {"rank": 4, "num_layers": adapted_layers})
    # LoRA's B starts at zero; random values make the adapters' gradients reach the layers below them
    model.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.1, model.trainable_parameters()))
    model.train()
    assert lowest_trained_layer(model) == 3 - adapted_layers
    loss_whole, grads_whole = _loss_and_gradients(model, whole, sizes, "dr_grpo")
    loss_pieces, grads_pieces = _loss_and_gradients(model, pieces, sizes, "dr_grpo")
    assert abs(loss_whole) > 1e-4
    assert {int(re.search(r"layers\.(\d+)\.", name).group(1)) for name in grads_whole} == set(
        range(3 - adapted_layers, 3)
    )
    assert min(np.abs(g).max() for g in grads_whole.values()) > 1e-7
    assert loss_pieces == pytest.approx(loss_whole, rel=1e-5, abs=1e-6)
    for name, g in grads_whole.items():
        np.testing.assert_allclose(grads_pieces[name], g, rtol=1e-4, atol=1e-6, err_msg=name)
