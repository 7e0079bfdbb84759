"""Each task's own JSONL reader names a bad line the same way, PATH:LINE, and skips blank lines."""

from types import SimpleNamespace

import pytest

from rewards import gsm8k
from rewards.jsonl import jsonl_records
from rewards.ocaml.problem_sets import read_problems
from rewards.web_browsing.training import read_task_file


def write(tmp_path, lines):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_records_skip_blank_lines_and_say_where_each_came_from(tmp_path):
    path = write(tmp_path, ['{"a": 1}', "", "   ", "[2]"])
    assert list(jsonl_records(path)) == [(f"{path}:1", {"a": 1}), (f"{path}:4", [2])]


def test_a_malformed_line_is_named_by_its_number(tmp_path):
    path = write(tmp_path, ['{"a": 1}', "", '{"a": '])
    with pytest.raises(ValueError, match=r"rows\.jsonl:3: malformed JSON"):
        list(jsonl_records(path))


@pytest.mark.parametrize(
    "read",
    [
        read_problems,
        read_task_file,
        lambda path: gsm8k.load_rows("train", SimpleNamespace(data=str(path), eval_num_problems=1)),
    ],
)
def test_every_task_reader_names_the_malformed_line(tmp_path, read):
    path = write(
        tmp_path,
        ['{"family": "fact", "difficulty": 1, "seed": 0, "question": "q", "answer": "#### 1"}', "not json"],
    )
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: malformed JSON"):
        read(path)


def test_a_web_row_missing_a_field_is_named_by_its_line(tmp_path):
    path = write(
        tmp_path, ['{"family": "fact", "difficulty": 1, "seed": 0}', "", '{"family": "fact", "seed": 1}']
    )
    with pytest.raises(ValueError, match=r"rows\.jsonl:3: a web task row needs .* \(no 'difficulty'\)"):
        read_task_file(path)


def test_a_gsm8k_row_without_a_question_is_named_by_its_line(tmp_path):
    path = write(tmp_path, ['{"question": "q", "answer": "#### 1"}', '{"answer": "#### 2"}'])
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: no 'question' text"):
        gsm8k.load_rows("train", SimpleNamespace(data=str(path), eval_num_problems=1))
