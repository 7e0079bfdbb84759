"""eval and compare's answers (compare.generate) and the held-out pass@k (heldout.evaluate_pass_at_k) draw
with keys of their own seed: MLX's global random state is neither read nor moved, so a notebook's draws after
them are the ones it seeded for, and the same seed gives the same answers whatever that state was."""

import mlx.core as mx

from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling import heldout
from mlx_grpo.run.task_setup import load_task


def then_draw(global_seed, play):
    """What play() gives, and MLX's next draw after it, from a global state seeded with global_seed."""
    mx.random.seed(global_seed)
    played = play()
    return played, mx.random.uniform(shape=(4,)).tolist()


def untouched_draw(global_seed):
    mx.random.seed(global_seed)
    return mx.random.uniform(shape=(4,)).tolist()


def test_compare_answers_leave_the_callers_random_state_alone(tiny_model_path):
    config = cmp.task_config(
        None, str(tiny_model_path), {"task": "arith", "eval_num_problems": 4, "max_tokens": 5}
    )
    task = load_task(config)
    settings = cmp.build_settings(config, samples=2, temperature=1.0)
    settings.concurrency = 4  # two rows a chunk: two chunks
    rows = cmp.select_rows(task, "test", 4)
    model, tokenizer = cmp.load_model(cmp.ModelSpec(str(tiny_model_path)))

    def answers():
        return [a.tokens for a in cmp.generate(model, tokenizer, task, rows, settings)[0]]

    first, after = then_draw(123, answers)
    assert after == untouched_draw(123)
    assert len({tuple(t) for t in first}) > 1  # really sampled
    again, _ = then_draw(999, answers)
    assert again == first  # the same seed, another global state: the same answers
    settings.seed = 1
    other, after = then_draw(123, answers)
    assert other != first and after == untouched_draw(123)


def test_held_out_pass_at_k_leaves_the_callers_random_state_alone(tiny_model_path, monkeypatch):
    config = cmp.task_config(
        None, str(tiny_model_path), {"task": "arith", "eval_num_problems": 4, "max_tokens": 5}
    )
    task = load_task(config)
    model, tokenizer = load_policy(str(tiny_model_path))
    drawn = []
    sample = heldout.sample_completions

    def recorded(*args, **kwargs):
        completions = sample(*args, **kwargs)
        drawn.append([c.tokens for c in completions])
        return completions

    monkeypatch.setattr(heldout, "sample_completions", recorded)

    def pass_at_k(seed):
        return lambda: heldout.evaluate_pass_at_k(model, tokenizer, task, 3, 5, 1.0, seed=seed)

    first, after = then_draw(123, pass_at_k(7))
    assert after == untouched_draw(123)
    assert len({tuple(t) for t in drawn[-1]}) > 1  # really sampled
    again, after = then_draw(999, pass_at_k(7))
    assert again == first and drawn[-1] == drawn[0] and after == untouched_draw(999)
    then_draw(123, pass_at_k(8))
    assert drawn[-1] != drawn[0]  # another seed draws other answers
    # The greedy held-out check draws nothing either.
    _, after = then_draw(123, lambda: heldout.evaluate_accuracy(model, tokenizer, task, 5))
    assert after == untouched_draw(123)
