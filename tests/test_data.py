"""Bad data rows: skipped with a count and the first line numbers, or (on_bad_data=error)
stopped at the first one with a clear message."""

import json
from types import SimpleNamespace

import pytest
from mlx_grpo.tasks.data import (
    DataError,
    load_rows,
    prompt_token_limit,
    required_columns,
    screen_rows,
    screen_task,
)

GOOD = json.dumps({"prompt": "what is 2 + 2?", "answer": "4"})


def write_lines(path, lines):
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return str(path)


BAD_LINES = [
    (b"\xff\xfe not utf-8", "not UTF-8"),
    ('{"prompt": "unclosed', "malformed JSON"),
    ('["a", "list"]', "not a JSON object"),
    ('{"question": "no prompt column"}', "no 'prompt' column"),
    ('{"prompt": "   "}', "empty or malformed prompt"),
    ('{"prompt": 42}', "empty or malformed prompt"),
    ('{"prompt": [{"role": "user"}]}', "empty or malformed prompt"),
    ('{"prompt": [{"role": "user", "content": 7}]}', "empty or malformed prompt"),
    ('{"prompt": "\\ud800 a lone surrogate"}', "empty or malformed prompt"),
]


def test_bad_lines_are_skipped_and_reported_by_line_number(tmp_path):
    lines = [GOOD, ""] + [bad for bad, _ in BAD_LINES] + [GOOD]
    rows, note = load_rows(write_lines(tmp_path / "d.jsonl", lines), "train")
    assert len(rows) == 2
    assert f"skipped {len(BAD_LINES)} bad row(s) of {len(BAD_LINES) + 2}" in note
    assert "first 5: line 3: not UTF-8; line 4: malformed JSON" in note  # line 2 is blank: not a row
    assert "line 7: empty or malformed prompt" in note


@pytest.mark.parametrize("bad, reason", BAD_LINES)
def test_on_bad_data_error_stops_at_the_first_bad_line(tmp_path, bad, reason):
    path = write_lines(tmp_path / "d.jsonl", [GOOD, GOOD, bad, GOOD])
    with pytest.raises(DataError) as err:
        load_rows(path, "train", on_bad="error")
    assert f"d.jsonl line 3: {reason}" in str(err.value)
    assert "on_bad_data=skip" in str(err.value)


def test_a_byte_order_mark_is_not_an_error(tmp_path):
    rows, note = load_rows(
        write_lines(tmp_path / "d.jsonl", [b"\xef\xbb\xbf" + GOOD.encode(), GOOD]), "train"
    )
    assert len(rows) == 2 and note is None


def test_json_list_and_broken_json_file(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"prompt": "a"}, {"nope": 1}, {"prompt": "b"}]))
    rows, note = load_rows(str(path), "train")
    assert [r["prompt"] for r in rows] == ["a", "b"] and "row 2: no 'prompt' column" in note
    path.write_text('[{"prompt": "a"},\n{"prompt": ')
    with pytest.raises(DataError, match="d.json: malformed JSON at line 2"):
        load_rows(str(path), "train")
    path.write_bytes(b"\xff[]")
    with pytest.raises(DataError, match="not UTF-8"):
        load_rows(str(path), "train")


def test_a_file_with_no_usable_row_says_why(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", ['{"q": 1}', "{bad"])
    with pytest.raises(
        DataError, match=r"no usable rows .*line 1: no 'prompt' column; line 2: malformed JSON"
    ):
        load_rows(path, "train")


def test_required_columns_come_from_reward_signatures():
    def needs_answer(prompts, completions, answer, unit="m", **kw):
        return []

    def needs_nothing(prompts, completions, **kw):
        return []

    assert required_columns([needs_answer, needs_nothing]) == {"answer": "needs_answer"}


class CharTokenizer:
    """One token per character, no chat template."""

    chat_template = None

    def encode(self, text):
        return [ord(c) for c in text]


def test_screen_rows_drops_missing_columns_and_long_prompts():
    rows = [
        {"prompt": "short", "answer": "1"},
        {"prompt": "x" * 30, "answer": "2"},
        {"prompt": "ok"},
        {"prompt": [{"role": "user", "content": "y" * 30}], "answer": "3"},
        {"prompt": "fine", "answer": "4"},
    ]
    kept, note = screen_rows(rows, CharTokenizer(), None, {"answer": "exact"}, 20, "skip", "train data")
    assert [r["answer"] for r in kept] == ["1", "4"]
    assert note == (
        "train data: skipped 3 bad row(s) of 5 (row 2: prompt of 30 tokens is longer than the limit "
        "of 20; row 3: no 'answer' column (reward exact needs it); row 4: prompt of 30 tokens is "
        "longer than the limit of 20)"
    )
    # the system prompt counts toward the length
    kept, note = screen_rows([{"prompt": "a" * 15}], CharTokenizer(), "s" * 10, {}, 20, "skip", "d")
    assert kept == [] and "prompt of 27 tokens" in note  # 10 + "\n\n" + 15
    with pytest.raises(DataError, match="d row 1: prompt of 27 tokens is longer than the limit of 20"):
        screen_rows([{"prompt": "a" * 15}], CharTokenizer(), "s" * 10, {}, 20, "error", "d")


def test_prompt_limit_from_the_model_context():
    assert prompt_token_limit(256, 48, None) == 208
    assert prompt_token_limit(256, 48, 100) == 100  # a configured limit wins
    assert prompt_token_limit(None, 48, None) is None  # unknown context: no limit
    with pytest.raises(
        DataError, match="max_prompt_tokens 220 \\+ max_tokens 48 exceed the model's context of 256"
    ):
        prompt_token_limit(256, 48, 220)
    with pytest.raises(DataError, match="max_tokens 256 leaves no room for a prompt"):
        prompt_token_limit(256, 256, None)


def test_screen_task_on_the_embedded_tokenizer():
    from mlx_grpo.models.screen_info import read_tokenizer
    from rewards import arith

    tokenizer, context = read_tokenizer(None)  # the embedded model's files; its weights are not needed
    task = SimpleNamespace(
        name="arith",
        reward_functions=[arith.correctness_reward],
        accuracy_reward=None,
        system_prompt=None,
        warnings=[],
        train_rows=[
            {"prompt": "Tom has 3 pens.", "answer": "3"},
            {"prompt": "Tom " * 60},
            {"prompt": "Ann has 2 pens. " * 60, "answer": "2"},
        ],
        eval_rows=[{"prompt": "Ann has 1 pen.", "answer": "1"}],
    )
    screen_task(task, tokenizer, context, max_tokens=48, max_prompt_tokens=None, on_bad="skip")
    assert task.train_rows == [{"prompt": "Tom has 3 pens.", "answer": "3"}]
    assert len(task.eval_rows) == 1
    (warning,) = task.warnings
    assert (
        "row 2: no 'answer' column" in warning and "row 3: prompt of" in warning and "limit of 208" in warning
    )
    task.train_rows = [{"prompt": "x"}]
    with pytest.raises(DataError, match="arith: no usable training rows"):
        screen_task(task, tokenizer, context, 48, None, "skip")
