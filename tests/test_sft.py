"""Supervised fine-tuning: the masked loss, the data formats, a task's own demonstrations, the loop."""

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import ConfigError, build_config
from mlx_grpo.models.adapters import prepare_for_training
from mlx_grpo.models.loading import embedded_model_path, load_policy
from mlx_grpo.run.health import TrainingStopped
from mlx_grpo.run.sft import batch_indices, sft
from mlx_grpo.run import sft_setup as sft_setup_module
from mlx_grpo.run.sft_setup import MAX_VALIDATION_TOKENS, sft_setup, task_rows, within_validation_tokens
from mlx_grpo.sampling.demonstrations import task_demonstrations
from mlx_grpo.sampling.multiturn import chat_join
from mlx_grpo.tasks.data import DataError, encode_prompt
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import recommended_settings
from mlx_grpo.tasks.sft_data import encode_demonstration, encode_rows, read_demonstrations
from mlx_grpo.update.sft_loss import pad_rows, sft_gradients, sft_loss
from rewards.multihop import tiny_model as tool_tiny
from rewards.web_browsing import tiny_model as web_tiny
from rewards.web_browsing.env import WebEnv
from rewards.web_browsing.tasks import task_from_row

needs_embedded = pytest.mark.skipif(
    not (embedded_model_path() / "config.json").exists(),
    reason="the embedded model has not been built (scripts/build_tiny_model.py)",
)


def _trained_text(tokenizer, ids, flags):
    return tokenizer.decode([i for i, f in zip(ids, flags) if f])


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    return load_policy(str(tiny_model_path))


# ---------------------------------------------------------------- the loss


def _numpy_loss(model, tokens, trained):
    """The mean cross-entropy of the trained targets from the model's logits, in float64 NumPy."""
    logits = np.array(model(tokens), dtype=np.float64)[:, :-1]
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    targets = np.array(tokens)[:, 1:]
    logp = np.take_along_axis(logits, targets[..., None], -1)[..., 0] - logz
    keep = np.array(trained)[:, 1:] > 0
    return -(logp * keep).sum() / keep.sum()


def _with_lora(tiny_model_path):
    model, _ = load_policy(str(tiny_model_path))
    prepare_for_training(model, "lora", {"rank": 4, "scale": 20.0, "dropout": 0.0, "num_layers": -1})
    return model


def test_the_loss_is_the_trained_tokens_cross_entropy(tiny_model_path):
    model = _with_lora(tiny_model_path)
    rng = np.random.default_rng(0)
    tokens = mx.array(rng.integers(3, 200, size=(3, 9)))
    trained = mx.array((rng.random((3, 9)) > 0.4).astype(np.float32))
    count = int(np.array(trained)[:, 1:].sum())
    expected = _numpy_loss(model, tokens, trained)
    for differentiated in (False, True):  # through the frozen head's forward-pass gradient too
        got = sft_loss(model, tokens, trained, count, differentiated=differentiated).item()
        assert got == pytest.approx(expected, rel=1e-5)


def test_a_masked_token_gets_exactly_zero_gradient(tiny_model_path):
    model = _with_lora(tiny_model_path)
    model.update(tree_map(lambda w: w + 0.01, model.trainable_parameters()))  # B = 0 would hide gradients
    tokens = mx.array([[5, 40, 41, 42, 43, 44, 45]])
    # Nothing trained: every gradient is exactly zero, not small.
    _, grads = sft_gradients(model, tokens, mx.zeros((1, 7)), 1)
    assert all(np.all(np.array(g) == 0) for _, g in tree_flatten(grads))
    # A trailing untrained target (read only, never an input to a trained one) changes nothing, bit for bit.
    trained = mx.array([[0, 0, 1, 1, 0, 0, 0]], dtype=mx.float32)
    _, a = sft_gradients(model, tokens, trained, 2)
    _, b = sft_gradients(model, mx.array([[5, 40, 41, 42, 43, 99, 7]]), trained, 2)
    assert any(np.any(np.array(g) != 0) for _, g in tree_flatten(a))
    for (name, ga), (_, gb) in zip(tree_flatten(a), tree_flatten(b)):
        assert np.array_equal(np.array(ga), np.array(gb)), name


def test_rows_are_padded_to_the_longest_untrained():
    tokens, trained = pad_rows([([1, 2, 3], [0, 1, 1]), ([4], [1])], pad_id=0)
    assert tokens.tolist() == [[1, 2, 3], [4, 0, 0]] and trained.tolist() == [[0, 1, 1], [1, 0, 0]]


# ---------------------------------------------------------------- the data formats


def test_a_prompt_and_completion_train_the_completion_after_train_s_prompt(tiny):
    _, tok = tiny
    ids, flags = encode_demonstration(
        tok, {"prompt": "What is 2+3?", "completion": "5"}, system_prompt="Be brief."
    )
    prompt = encode_prompt(tok, "What is 2+3?", "Be brief.")
    assert ids[: len(prompt)] == prompt and not any(flags[: len(prompt)])
    assert _trained_text(tok, ids, flags) == "5<|im_end|>"


def test_every_assistant_turn_is_trained_and_nothing_else(tiny):
    _, tok = tiny
    row = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "u2"},
            {"role": "assistant", "content": "a2"},
        ]
    }
    ids, flags = encode_demonstration(tok, row)
    assert ids == list(tok.apply_chat_template(row["messages"], tokenize=True))
    assert _trained_text(tok, ids, flags) == "a1<|im_end|>a2<|im_end|>"
    read = tok.decode([i for i, f in zip(ids, flags) if not f])
    assert "u1" in read and "u2" in read and "S" in read and "a1" not in read


# The non-tools part of Qwen2.5's template: a default system block when the conversation has no system
# message.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant."
    "<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.parametrize("template", [None, QWEN25_TEMPLATE], ids=["plain", "qwen2.5-default-system"])
def test_a_conversation_opening_with_the_reply_trains_the_reply_alone(tiny_model_path, template):
    """An assistant-first conversation: the template's header and the system block it inserts on its own are
    read only; the reply and its end-of-turn token are what is trained."""
    _, tok = load_policy(str(tiny_model_path))
    if template:
        tok.chat_template = template
    row = {"messages": [{"role": "assistant", "content": "Hello there"}]}
    ids, flags = encode_demonstration(tok, row)
    assert ids == list(tok.apply_chat_template(row["messages"], tokenize=True))
    assert _trained_text(tok, ids, flags) == "Hello there<|im_end|>"
    read = tok.decode(ids[: flags.index(1.0)])  # all before the reply, read only
    assert read.endswith("<|im_start|>assistant\n") and ("You are Qwen" in read) == bool(template)
    # A later turn of the same conversation is trained as before: each reply and its end token.
    longer = {
        "messages": [
            *row["messages"],
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a2"},
        ]
    }
    assert _trained_text(tok, *encode_demonstration(tok, longer)) == "Hello there<|im_end|>a2<|im_end|>"


def test_a_text_row_is_trained_whole(tiny):
    _, tok = tiny
    ids, flags = encode_demonstration(tok, {"text": "hello"})
    assert tok.decode(ids) == "hello<|im_end|>" and all(flags)


def test_a_base_model_gets_the_task_s_plain_text_frame(tiny_model_path, tmp_path):
    folder = tmp_path / "base"
    shutil.copytree(tiny_model_path, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    _, tok = load_policy(str(folder))
    frame = "Q: {prompt}\nA:"
    ids, flags = encode_demonstration(tok, {"prompt": "2+3?", "completion": " 5"}, None, frame, stop=["\n"])
    prompt = encode_prompt(tok, "2+3?", None, frame)
    assert (
        ids[: len(prompt)] == prompt
        and tok.decode(ids[len(prompt) :]) == " 5\n"
        and all(flags[len(prompt) :])
    )


def test_a_file_a_folder_and_bad_rows(tmp_path, tiny):
    _, tok = tiny
    good = {"prompt": "p", "completion": "c"}
    lines = [
        json.dumps(good),
        "{not json",
        json.dumps({"messages": [{"role": "user", "content": "q"}]}),
        json.dumps({"question": "?"}),
        json.dumps({"text": "t"}),
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    rows, note = read_demonstrations(str(tmp_path / "train.jsonl"), "train")
    assert [n for n, _ in rows] == [1, 5]
    assert "skipped 3 bad row(s) of 5" in note and "line 2: malformed JSON" in note
    assert "line 3: no assistant message to learn from" in note and "line 4: none of the fields" in note
    with pytest.raises(DataError, match=r"train.jsonl line 2: malformed JSON"):
        read_demonstrations(str(tmp_path / "train.jsonl"), "train", on_bad="error")
    (tmp_path / "valid.jsonl").write_text(json.dumps(good) + "\n")
    assert len(read_demonstrations(str(tmp_path), "validation")[0]) == 1
    assert (
        read_demonstrations(str(tmp_path / "train.jsonl"), "validation")[0] == []
    )  # a file has no validation split
    examples, note = encode_rows(tok, [(1, good), (2, {"text": "x" * 300})], "f.jsonl", "skip", limit=64)
    assert len(examples) == 1 and "line 2: 301 tokens, longer than the model's context of 64" in note


def test_a_bad_data_file_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "?"}\n')
    result = CliRunner().invoke(app, ["sft", "--data", str(bad), "--output", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "no usable rows" in result.output and "line 1: none of the fields" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()


# ---------------------------------------------------------------- a task's own demonstrations


@pytest.mark.skipif(web_tiny.tiny_web_model() is None, reason="the tiny web model has not been built")
def test_web_demonstrations_are_the_rollout_s_tokens_with_the_pages_masked():
    config = build_config({"task": "web"}, task_defaults=recommended_settings)
    task = load_task(config)
    _, tok = load_policy(config.model)
    rows = task.train_rows[:3]
    examples, note = task_demonstrations(task, tok, rows, config.max_episode_tokens, "error", "web")
    join = chat_join(tok, task.system_prompt)
    for row, (ids, flags) in zip(rows, examples):
        # Built independently: the first page through the template, then each action and its end token
        # (trained), then the next page as a rollout joins it (read only).
        env = WebEnv(task_from_row(row))
        want = encode_prompt(tok, env.reset(), task.system_prompt)
        want_flags = [0.0] * len(want)
        for action in task_from_row(row).oracle_actions():
            turn = list(tok.encode(action, add_special_tokens=False)) + [tok.eos_token_id]
            want, want_flags = want + turn, want_flags + [1.0] * len(turn)
            page, done, _ = env.step(action)
            if done:
                break
            joined = list(tok.encode(join.text(page, True), add_special_tokens=False))
            want, want_flags = want + joined, want_flags + [0.0] * len(joined)
        assert ids == want and flags == want_flags
        assert "answer[" in _trained_text(tok, ids, flags) and "==" not in _trained_text(tok, ids, flags)


@pytest.mark.skipif(tool_tiny.tiny_tool_model() is None, reason="the tiny tool model has not been built")
def test_multihop_demonstrations_read_each_hop_then_answer_with_the_results_masked():
    config = build_config({"task": "multihop"}, task_defaults=recommended_settings)
    task = load_task(config)
    _, tok = load_policy(config.model)
    rows = task.train_rows[:3]
    examples, _ = task_demonstrations(task, tok, rows, config.max_episode_tokens, "error", "multihop")
    for row, (ids, flags) in zip(rows, examples):
        trained = _trained_text(tok, ids, flags)
        read_only = tok.decode([i for i, f in zip(ids, flags) if not f])
        hops = len(row["question_decomposition"])
        assert trained.count("<tool_call>") == hops and trained.endswith(row["answer"] + tok.eos_token)
        supporting = [p for p in row["paragraphs"] if p.get("is_supporting")]
        assert all(
            p["paragraph_text"] not in trained and p["paragraph_text"] in read_only for p in supporting
        )


@needs_embedded
def test_task_demonstrations_come_from_the_train_split_only():
    config = build_config({"task": "arith", "steps": 2, "batch_size": 4}, task_defaults=recommended_settings)
    run = sft_setup(config)
    task = load_task(config)
    held_out = {r["prompt"] for r in task.eval_rows + task.test_rows}  # validation and test alike
    learned = {run.tokenizer.decode(ids) for ids, _ in run.train}
    assert len(run.train) == 8 and len(run.valid) == sft_setup_module.MAX_HELD_OUT
    assert not any(p in text for p in held_out for text in learned)
    # The validation loss reads the validation split: the rows the run's accuracy checks read, never test.
    validation = [r["prompt"] for r in task.eval_rows[: sft_setup_module.MAX_HELD_OUT]]
    assert all(p in run.tokenizer.decode(ids) for p, (ids, _) in zip(validation, run.valid))


def test_a_run_trains_on_a_seeded_draw_of_every_kind_not_the_split_s_head():
    # The web train split is stored kind by kind: its first 32 rows are all fact/1.
    config = build_config({"task": "web", "steps": 16, "batch_size": 2, "seed": 0})
    task = load_task(config)
    kind = lambda row: (row["family"], row["difficulty"])  # noqa: E731
    assert {kind(r) for r in task.train_rows[:32]} == {("fact", 1)}
    train, held_out = task_rows(task, config)
    assert len(train) == 32 and len({kind(r) for r in train}) >= 8  # 12 kinds in all
    assert not {r["task_id"] for r in train} & {r["task_id"] for r in held_out}
    assert task_rows(task, config) == (train, held_out)  # the seed decides
    other, _ = task_rows(task, build_config({"task": "web", "steps": 16, "batch_size": 2, "seed": 1}))
    assert other != train


def test_the_validation_loss_reads_a_bounded_number_of_tokens():
    rows = [([1] * 3000, [0.0] * 3000) for _ in range(5)]
    warnings = []
    kept = within_validation_tokens(rows, warnings)
    assert len(kept) == MAX_VALIDATION_TOKENS // 3000 and "first 2 of 5" in warnings[0]
    short = [([1] * 10, [1.0] * 10)] * 4
    assert (
        within_validation_tokens(short, warnings) == short and len(warnings) == 1
    )  # nothing left out, no note
    assert len(within_validation_tokens([([1] * 9000, [1.0] * 9000)], [])) == 1  # one long row is still read


@needs_embedded
def test_a_task_given_data_learns_the_rows_reference_answers(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt": f"Q{i}", "answer": "1", "solution": f"R{i}\n#### 1"}) + "\n"
            for i in range(30)
        )
    )
    run = sft_setup(
        build_config(
            {"task": "arith", "data": str(path), "steps": 1, "batch_size": 4},
            task_defaults=recommended_settings,
        )
    )
    trained = [_trained_text(run.tokenizer, *e) for e in run.train]
    assert len(set(trained)) == 4 and set(trained) <= {f"R{i}\n#### 1<|im_end|>" for i in range(30)}


def test_sft_without_data_or_task_is_refused():
    with pytest.raises(ConfigError, match="sft needs --data"):
        sft_setup(build_config({"task": "custom", "reward_file": None}))


# ---------------------------------------------------------------- the loop


def test_the_data_order_is_a_function_of_seed_and_step():
    seen = [i for step in range(1, 4) for i in batch_indices(5, 2, step, seed=3)]
    assert sorted(seen[:5]) == [0, 1, 2, 3, 4]  # one whole pass before any repeats
    assert batch_indices(5, 2, 3, seed=3) == seen[4:6]


@needs_embedded
def test_a_resumed_run_ends_with_the_uninterrupted_run_s_weights(tmp_path):
    settings = {"task": "arith", "steps": 4, "save_every": 2, "eval_num_problems": 8, "batch_size": 4}
    whole = sft(
        build_config({**settings, "output": str(tmp_path / "whole")}, task_defaults=recommended_settings)
    )

    def stop_at_2(kind, data):
        if kind == "checkpoint" and data["step"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sft(
            build_config({**settings, "output": str(tmp_path / "cut")}, task_defaults=recommended_settings),
            stop_at_2,
        )
    resumed = sft(
        build_config({**settings, "resume": str(tmp_path / "cut")}, task_defaults=recommended_settings)
    )
    a = mx.load(str(whole.run_dir / "adapters.safetensors"))
    b = mx.load(str(resumed.run_dir / "adapters.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(np.array(a[k]), np.array(b[k])) for k in a)
    rows = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    assert [r["loss"] for r in rows if "loss" in r] == [m["loss"] for m in whole.history]


@needs_embedded
def test_non_finite_steps_leave_the_weights_and_stop_the_run(tmp_path, monkeypatch):
    import mlx_grpo.run.sft as sft_module

    real = sft_module.sft_gradients

    def poisoned(model, tokens, trained, count, chunk=None):
        loss, grads = real(model, tokens, trained, count, chunk)
        return loss * float("nan"), grads

    monkeypatch.setattr(sft_module, "sft_gradients", poisoned)
    config = build_config(
        {
            "task": "arith",
            "steps": 5,
            "max_nonfinite_steps": 2,
            "eval_num_problems": 4,
            "output": str(tmp_path / "run"),
        },
        task_defaults=recommended_settings,
    )
    with pytest.raises(TrainingStopped, match="NaN/Inf on 2 steps in a row"):
        sft(config)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_updates"] for r in rows if "loss" in r] == [1, 1]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stopped"]


@needs_embedded
def test_sft_lifts_the_embedded_model_on_arith(tmp_path):
    """At the defaults, 80 steps on arith's reference solutions: +0.2 greedy accuracy on the 200 held-out."""
    result = sft(
        build_config(
            {"task": "arith", "steps": 80, "output": str(tmp_path / "run")},
            task_defaults=recommended_settings,
        )
    )
    assert result.eval_n == 200
    assert result.accuracy_after >= result.accuracy_before + 0.2, result.summary_line()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    before, final = rows[0], rows[-1]
    assert before["before"] and final["final"] and final["val_loss"] < before["val_loss"]
    assert all(np.isfinite(m["grad_norm"]) and m["skipped_updates"] == 0 for m in result.history)
