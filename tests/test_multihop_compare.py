"""`compare --task multihop` on questions a run never trained on: MuSiQue rows of any world from a folder
that holds only held-out files, and made-up questions of another length (--multihop-hops), both under
the held-out check."""

import json

import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import _all_or_typed, app
from mlx_grpo.evaluation import compare as cmp
from mlx_grpo.models.screen_info import read_tokenizer
from mlx_grpo.run.setup import guard_task
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.data import DataError
from mlx_grpo.tasks.splits import record_training_rows
from rewards.multihop.tiny_model import TINY_TOOL_MODEL, tiny_tool_model

needs_tool_model = pytest.mark.skipif(
    tiny_tool_model() is None,
    reason="the tiny tool model has not been built (scripts/build_tiny_tool_model.py)",
)
MODEL = str(TINY_TOOL_MODEL)


def _row(id_, question, answer, hops, aliases=()):
    """A MuSiQue row: one supporting paragraph a hop, each naming the next hop's subject, and a distractor."""
    paragraphs = [
        {"idx": i, "title": title, "paragraph_text": f"{title} leads to {nxt}.", "is_supporting": True}
        for i, (title, nxt) in enumerate(zip(hops, [*hops[1:], answer]))
    ]
    paragraphs.append(
        {
            "idx": len(hops),
            "title": "Lisbon",
            "paragraph_text": "Lisbon is in Portugal.",
            "is_supporting": False,
        }
    )
    steps = [
        {"id": i, "question": f"What does {t} lead to?", "answer": n, "paragraph_support_idx": i}
        for i, (t, n) in enumerate(zip(hops, [*hops[1:], answer]))
    ]
    return {
        "id": id_,
        "question": question,
        "answer": answer,
        "answer_aliases": list(aliases),
        "paragraphs": paragraphs,
        "question_decomposition": steps,
    }


ROWS = [
    _row(
        "2hop__11_22",
        "In which country was the author of Dracula born?",
        "Ireland",
        ["Dracula", "Bram Stoker"],
    ),
    _row(
        "3hop1__33_44_55",
        "What is the capital of the country where the composer of Finlandia was born?",
        "Helsinki",
        ["Finlandia", "Jean Sibelius", "Finland"],
    ),
    _row(
        "2hop__66_77",
        "Who directed the film that won Best Picture in 1998?",
        "James Cameron",
        ["Oscar 1998", "Titanic"],
    ),
]


def _write(folder, name, rows):
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _compare(tmp_path, out, *flags):
    result = CliRunner().invoke(
        app,
        ["compare", "--trained", MODEL, "--base", MODEL, "--task", "multihop", "--max-tokens", "8"]
        + ["--output", str(tmp_path / out), "--no-plot", *flags],
    )
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in (tmp_path / out / "rows.jsonl").read_text().splitlines()]


@needs_tool_model
def test_compare_scores_exactly_the_musique_rows_of_a_folder_with_test_jsonl_alone(tmp_path):
    folder = _write(tmp_path / "musique", "test.jsonl", ROWS)
    scored = _compare(tmp_path, "first", "--data", str(folder))
    assert [r["prompt"] for r in scored] == [r["question"] for r in ROWS]
    assert [r["columns"]["answer"] for r in scored] == [r["answer"] for r in ROWS]
    report = json.loads((tmp_path / "first" / "report.json").read_text())
    assert report["n"] == len(ROWS) and report["split"] == "test"
    # Scored against the rows' answers: the same questions with the model's own first answer as the
    # second row's answer are right on that row alone.
    said = scored[1]["trained"]["completions"][0]
    assert scored[1]["trained"]["accuracy"] == 0.0
    changed = [ROWS[0], {**ROWS[1], "answer": said}, ROWS[2]]
    rescored = _compare(
        tmp_path, "second", "--data", str(_write(tmp_path / "changed", "test.jsonl", changed))
    )
    assert [r["trained"]["accuracy"] for r in rescored] == [0.0, 1.0, 0.0]
    assert [r["base"]["accuracy"] for r in rescored] == [0.0, 1.0, 0.0]


@needs_tool_model
def test_a_folder_of_held_out_files_gives_each_split_and_nothing_to_train_on(tmp_path):
    folder = _write(
        tmp_path / "musique", "dev.jsonl", ROWS[:2]
    )  # MuSiQue's dev set: test, without test.jsonl
    _write(folder, "validation.jsonl", ROWS[2:])
    config = cmp.task_config(None, MODEL, {"task": "multihop", "data": str(folder)})
    task = load_task(config)
    assert [r["id"] for r in task.test_rows] == [r["id"] for r in ROWS[:2]]
    assert [r["id"] for r in task.eval_rows] == [ROWS[2]["id"]] and task.train_rows == []
    tokenizer, context = read_tokenizer(MODEL)
    with pytest.raises(DataError, match="no usable training rows"):  # train refuses it; compare does not
        guard_task(load_task(config), config, tokenizer, context)
    guard_task(task, config, tokenizer, context, training=False)
    assert len(task.test_rows) == 2
    with pytest.raises(Exception, match="no train.jsonl"):  # a folder of nothing is still a mistake
        load_task(cmp.task_config(None, MODEL, {"task": "multihop", "data": str(tmp_path)}))


def _fake_run(tmp_path, settings: str, trained_rows):
    """A run folder as the held-out check reads it: its config.yaml and the record of its train rows."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"model: {MODEL}\ntask: multihop\n{settings}")
    record_training_rows(run, trained_rows, "multihop", None)
    return run


@needs_tool_model
def test_a_run_trained_on_musique_rows_is_not_scored_on_them(tmp_path):
    train = _write(tmp_path / "train", "train.jsonl", ROWS[:2])
    trained = load_task(cmp.task_config(None, MODEL, {"task": "multihop", "data": str(train)})).train_rows
    run = _fake_run(tmp_path, f"data: {train}\n", trained)
    held_out = _write(tmp_path / "held", "test.jsonl", [ROWS[2], trained[0]])
    config = cmp.task_config(run, MODEL, {"data": str(held_out), "max_tokens": 8})
    task, settings = load_task(config), cmp.build_settings(config)
    spec = cmp.ModelSpec(MODEL, None, run)
    with pytest.raises(cmp.CompareError, match="1 of the 2 test rows were training rows of"):
        cmp.compare(cmp.ModelSpec(MODEL), spec, task, settings)


@needs_tool_model
def test_multihop_hops_scores_three_hop_questions_a_two_hop_run_never_saw(tmp_path):
    scored = _compare(tmp_path, "cli", "--multihop-hops", "3", "--n", "4")
    assert len(scored) == 4 and all(len(r["columns"]["question_decomposition"]) == 3 for r in scored)
    two_hop = {"task": "multihop", "multihop_hops": [2], "multihop_chains": []}
    trained = load_task(cmp.task_config(None, MODEL, two_hop)).train_rows  # what such a run trains on
    run = _fake_run(tmp_path, "multihop_hops: [2]\nmultihop_chains: []\n", trained)

    def three_hop_task():
        config = cmp.task_config(run, MODEL, {"multihop_hops": _all_or_typed("3"), "eval_num_problems": 4})
        assert config.task_options.multihop_hops == [3]
        return load_task(config), cmp.build_settings(config)

    task, settings = three_hop_task()
    report = cmp.compare(cmp.ModelSpec(MODEL), cmp.ModelSpec(MODEL, None, run), task, settings)
    assert report.data["n"] == 4 and all(len(r["question_decomposition"]) == 3 for r in report.rows)
    assert cmp.task_config(run, MODEL, {}).task_options.multihop_hops == [2]  # the run's, untyped
    assert (
        cmp.task_config(run, MODEL, {"multihop_hops": _all_or_typed("all")}).task_options.multihop_hops == []
    )
    # The held-out check still applies: a run that trained on one of those questions is refused.
    record_training_rows(run, [*trained, report.rows[0]], "multihop", None)
    task, settings = three_hop_task()
    with pytest.raises(cmp.CompareError, match="1 of the 4 test rows were training rows of"):
        cmp.compare(cmp.ModelSpec(MODEL), cmp.ModelSpec(MODEL, None, run), task, settings)
