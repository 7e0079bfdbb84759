"""--guide (run/guidance.py): a reference answer replaces one member of each group with no right answer."""

import json
from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from typer.testing import CliRunner

from marks import needs_ocaml
from mlx_grpo import make_config
from mlx_grpo.api import load_task
from mlx_grpo.cli import app
from mlx_grpo.config import ConfigError, TrainConfig
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run import guidance
from mlx_grpo.run.step_rollouts import rollout_settings
from mlx_grpo.run.trainer import train
from mlx_grpo.sampling.rollout import SamplingConfig, sample_completions
from mlx_grpo.tasks.data import task_prompts
from mlx_grpo.tasks.rewarding import score_completions
from mlx_grpo.update.logprobs import token_logprobs

REWARDS = '''
def exact(prompts, completions, answer, **kwargs):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

def short(prompts, completions, **kwargs):
    return [1.0 if len(c) < 12 else 0.0 for c in completions]

def first_is_right(prompts, completions, answer, **kwargs):
    """Row 0's first member is right whatever it says; nothing else is."""
    return [1.0 if i == 0 else 0.0 for i in range(len(completions))]
'''


@pytest.fixture
def data(tmp_path):
    rows = [
        {"prompt": f"Spell {w}.", "answer": w, "reference": w}
        for w in ["cat", "dog", "sun", "map", "pen", "cup", "hat", "box", "jar", "fox", "owl", "elk"] * 4
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rewards.py").write_text(REWARDS)
    return path


def _settings(sampling):
    """A run's rollout settings with groups of four, sampled as `sampling` says."""
    return replace(rollout_settings(TrainConfig()), group_size=4, sampling=sampling)


def _config(tmp_path, model, data, **more):
    return make_config(
        model=str(model),
        data=str(data),
        reward_file=str(tmp_path / "rewards.py"),
        **{
            "reward": ["exact", "short"],
            "group_size": 4,
            "batch_size": 3,
            "max_tokens": 6,
            "temperature": 1.0,
            "seed": 0,
            "output": str(tmp_path / "run"),
            **more,
        },
    )


def test_a_reference_follows_the_generation_prompt_as_the_template_puts_an_answer(
    tmp_path, tiny_model_path, data
):
    """The prompt's tokens and the reference's are the chat template's rendering of the whole conversation."""
    task = load_task(_config(tmp_path, tiny_model_path, data, guide=True))
    model, tokenizer = load_policy(str(tiny_model_path))
    row = task.train_rows[0]
    [prompt] = task_prompts(tokenizer, task, [row])
    text = task.reference_answer(row)
    guided = guidance.reference_completion(model, tokenizer, task, prompt, text, 0, 1.0)
    rendered = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": text}],
            tokenize=True,
        )
    )
    ours = list(prompt) + list(guided.tokens)
    assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    assert rendered[: len(ours)] == ours, (tokenizer.decode(rendered), tokenizer.decode(ours))
    assert tokenizer.decode(guided.tokens).startswith(row["answer"])


def test_every_all_wrong_group_gets_the_reference_scored_and_with_the_policys_logprobs(
    tmp_path, tiny_model_path, data
):
    config = _config(tmp_path, tiny_model_path, data)
    task = load_task(config)
    model, tokenizer = load_policy(str(tiny_model_path))
    rows = task.train_rows[:3]
    completions = sample_completions(
        model, tokenizer, task_prompts(tokenizer, task, rows), 4, SamplingConfig(1.0, max_tokens=6), 64
    )
    columns = {"answer": [r["answer"] for r in rows for _ in range(4)]}
    scores = score_completions(
        task.reward_functions,
        task.reward_weights,
        [r["prompt"] for r in rows for _ in range(4)],
        [c.text for c in completions],
        columns,
    )
    assert scores.parts["exact"] == [0.0] * 12  # a random model never spells the word

    guided, rescored = guidance.guide_groups(
        model, tokenizer, task, rows, completions, scores, _settings(SamplingConfig(0.7))
    )
    for i, row in enumerate(rows):
        ref = guided[4 * i + 3]
        assert ref.guided and ref.text == row["reference"] and ref.finish_reason == "stop"
        assert (
            ref.tokens[-1] == tokenizer.eos_token_id
            and ref.prompt_tokens == completions[4 * i + 3].prompt_tokens
        )
        # the behaviour log-probs are the policy's at the sampling temperature, token by token
        whole = mx.array([ref.prompt_tokens + ref.tokens])
        expected = np.array(token_logprobs(model, whole, 0.7)[0][0, len(ref.prompt_tokens) - 1 :])
        np.testing.assert_allclose(ref.logprobs, expected, rtol=1e-5, atol=1e-5)
        assert guided[4 * i : 4 * i + 3] == completions[4 * i : 4 * i + 3]  # the sampled members stay
        assert rescored.parts["exact"][4 * i : 4 * i + 4] == [0.0, 0.0, 0.0, 1.0]
        assert rescored.parts["short"][4 * i + 3] == 1.0
        assert rescored.total[4 * i + 3] == pytest.approx(2.0)
    assert scores.parts["exact"] == [0.0] * 12  # the scores passed in are not changed


def test_a_group_that_holds_a_right_answer_is_left_as_sampled(tmp_path, tiny_model_path, data):
    config = _config(tmp_path, tiny_model_path, data, reward=["first_is_right"])
    task = load_task(config)
    model, tokenizer = load_policy(str(tiny_model_path))
    rows = task.train_rows[:2]
    completions = sample_completions(
        model, tokenizer, task_prompts(tokenizer, task, rows), 4, SamplingConfig(1.0, max_tokens=6), 64
    )
    scores = score_completions(
        task.reward_functions,
        task.reward_weights,
        ["p"] * 8,
        [c.text for c in completions],
        {"answer": ["x"] * 8},
    )
    guided, _ = guidance.guide_groups(
        model, tokenizer, task, rows, completions, scores, _settings(SamplingConfig(1.0))
    )
    assert [c.guided for c in guided] == [False] * 7 + [True]


def test_a_guided_run_raises_the_references_probability_and_says_what_it_did(tmp_path, tiny_model_path, data):
    config = _config(
        tmp_path,
        tiny_model_path,
        data,
        guide=True,
        steps=6,
        lr=3e-3,
        warmup_steps=0,
        eval_num_problems=4,
        save_every=100,
    )
    train(config)
    run = tmp_path / "run"
    records = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    guided = [r for r in records if r.get("guided")]
    assert len(guided) == 6 * 3  # every group of every step: the random model never spells a word
    assert all(r["rewards"]["exact"] == 1.0 and r["advantage"] > 0 for r in guided)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"guide/' in x]
    assert [m["guide/groups_frac"] for m in metrics] == [1.0] * 6
    assert all(
        m["guide/sampled_accuracy"] == 0.0 for m in metrics
    )  # the model's own samples, reference left out

    # learning: the references' log-probability under the trained model rose above the base's
    task = load_task(config)
    base, tokenizer = load_policy(str(tiny_model_path))
    trained, _ = load_policy(str(tiny_model_path), str(run))

    def reference_logprob(model):
        total = 0.0
        for row in task.train_rows[:12]:
            prompt = task_prompts(tokenizer, task, [row])[0]
            ref = guidance.reference_completion(model, tokenizer, task, prompt, row["reference"], 0, 1.0)
            total += sum(ref.logprobs)
        return total

    before, after = reference_logprob(base), reference_logprob(trained)
    assert after > before + 1.0, (before, after)


def test_without_negatives_a_guided_group_trains_the_reference_alone():
    # two groups of 4: the first guided (its last member the reference), the second sampled as it came
    rewards = np.array([0.0, 0.0, -0.5, 1.0, 1.0, 0.0, 1.0, 0.0])
    guided = [False, False, False, True] + [False] * 4
    grouped = rewards.reshape(2, 4)
    usual = (grouped - grouped.mean(axis=1, keepdims=True)).reshape(-1)  # dr_grpo's r - mean, by hand
    np.testing.assert_allclose(usual, [-0.125, -0.125, -0.625, 0.875, 0.5, -0.5, 0.5, -0.5])
    np.testing.assert_allclose(
        guidance.without_guided_negatives(usual, guided, 4), [0.0, 0.0, 0.0, 0.875, 0.5, -0.5, 0.5, -0.5]
    )


def test_the_references_stay_marked_through_the_updates_micro_batches():
    """guide_shaping reads which rows are references: the mark travels with its row, through pieces cut
    by length and groups left out for carrying no signal."""
    from mlx_grpo.sampling.rollout import Completion
    from mlx_grpo.update.batch import build_batch, groups_with_signal, micro_batches

    lengths = [5, 2, 7, 3, 4, 6, 1, 2, 3, 3, 3, 3]  # three groups of 4; the middle one has no signal
    guided = [False, False, False, True, False, False, False, False, False, True, False, False]
    completions = [
        Completion(0, [1, 2], [100 + i] * n, [-0.5] * n, "stop", "", guided=g)
        for i, (n, g) in enumerate(zip(lengths, guided))
    ]
    advantages = [-0.1, -0.1, -0.1, 0.3, 0.0, 0.0, 0.0, 0.0, 0.2, 0.2, -0.2, -0.2]
    batch = groups_with_signal(build_batch(completions, advantages, 4))
    parts = micro_batches(batch, 2, by_length=True)
    seen = {}
    for mb in parts:
        for row, mark in zip(np.array(mb.completions)[:, 0].tolist(), np.array(mb.guided).tolist()):
            seen[row - 100] = mark
    assert seen == {i: guided[i] for i in (0, 1, 2, 3, 8, 9, 10, 11)}
    assert build_batch(completions[4:8], advantages[4:8], 4).guided is None  # no reference: nothing to mark


def test_a_run_without_guided_negatives_logs_zero_for_the_models_own_answers(tmp_path, tiny_model_path, data):
    config = _config(
        tmp_path,
        tiny_model_path,
        data,
        guide=True,
        guide_negatives=False,
        steps=1,
        warmup_steps=0,
        eval_num_problems=4,
        save_every=100,
    )
    train(config)
    records = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(records) == 12 and sum(bool(r.get("guided")) for r in records) == 3
    assert all(r["advantage"] > 0 if r.get("guided") else r["advantage"] == 0.0 for r in records)
    with pytest.raises(ConfigError, match="needs guide: true"):
        make_config(guide_negatives=False)


def test_a_task_without_references_is_one_clear_error(tmp_path, tiny_model_path):
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(30)))
    (tmp_path / "rewards.py").write_text(REWARDS)
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            str(tiny_model_path),
            "--data",
            str(path),
            "--reward-file",
            str(tmp_path / "rewards.py"),
            "--reward",
            "exact",
            "--guide",
            "--steps",
            "1",
            "--output",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "--guide needs reference answers" in result.output
    with pytest.raises(ConfigError, match="group_size >= 2"):
        make_config(guide=True, group_size=1)


def test_gsm8k_reference_is_the_worked_solution_without_calculator_notes():
    from rewards import gsm8k

    row = {
        "prompt": "q",
        "answer": "72",
        "solution": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72",
    }
    reference = gsm8k.reference_answer(row)
    assert reference == "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips.\n#### 72"
    assert gsm8k.correctness_reward(["q"], [reference], ["72"], finish_reason=["stop"]) == [1.0]
    assert gsm8k.format_reward(["q"], [reference]) == [1.0]
    assert gsm8k.reference_answer({"prompt": "q", "answer": "1"}) is None


def test_a_base_models_reference_follows_its_frame_and_ends_at_the_stop_string(
    tmp_path, tiny_model_path, data
):
    config = _config(tmp_path, tiny_model_path, data, prompt_format="Q: {prompt}\nA:", stop=["\n\n"])
    task = load_task(config)
    model, tokenizer = load_policy(str(tiny_model_path))
    ref = guidance.reference_completion(model, tokenizer, task, [1, 2, 3], "cat", 0, 1.0)
    assert ref.text == " cat" and tokenizer.decode(ref.tokens) == " cat\n\n"  # no end-of-text token: the stop
    task.prompt_format = "Q: {prompt}\nA: "
    assert guidance.reference_completion(model, tokenizer, task, [1, 2, 3], "cat", 0, 1.0).text == "cat"


@needs_ocaml
def test_ocaml_references_are_fenced_solutions_that_pass_every_test():
    """--guide on OCaml trains on the train split's reference solutions, so each must be written as the system
    prompt asks (one ```ocaml block) and pass every one of its problem's tests through the task's own
    reward."""
    from rewards import ocaml

    task = load_task(make_config(task="ocaml"))
    guidance.check_guidance(task)  # the task qualifies: single-turn, an accuracy reward, references
    rows = task.train_rows
    references = [task.reference_answer(r) for r in rows]
    assert len(rows) >= 90 and all(r.startswith("```ocaml\nlet ") and r.endswith("\n```") for r in references)
    passes = ocaml.ocaml_passes(
        [r["prompt"] for r in rows],
        references,
        [r["signature"] for r in rows],
        [r["tests"] for r in rows],
        [r["preamble"] for r in rows],
    )
    assert passes == [1.0] * len(rows)
    assert ocaml.reference_answer({"prompt": "p", "signature": "let f (x : int) : int ="}) is None
