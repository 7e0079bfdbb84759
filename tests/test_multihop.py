"""The multihop task (rewards/multihop): a seeded world whose decompositions follow its facts, BM25
search and read over a row's paragraphs, EM/F1 against hand-worked cases, MuSiQue rows read or refused
one by one, and whole episodes through the registry, scored on their final answer."""

import json

import pytest

from mlx_grpo.config import ConfigError, build_config
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import recommended_settings
from rewards.multihop import (
    Corpus,
    exact_match,
    final_answer,
    load_musique,
    make_row,
    make_world,
    normalize,
    token_f1,
)
from rewards.multihop.answers import exact_match_reward, f1_reward, support_reward
from rewards.multihop.training import MultihopEnv, synthetic_rows


@pytest.mark.parametrize("hops", [2, 3, 4])
def test_a_question_is_answered_by_following_its_decomposition_through_the_world(hops):
    for i in range(20):
        row = make_row(f"t/{i}", hops)
        world = make_world(f"t/{i}")
        steps = row["question_decomposition"]
        assert len(steps) == hops and steps[-1]["answer"] == row["answer"]
        titles = [p["title"] for p in row["paragraphs"]]
        for k, step in enumerate(steps):
            paragraph = row["paragraphs"][step["paragraph_support_idx"]]
            assert paragraph["is_supporting"] and step["answer"] in paragraph["paragraph_text"]
            if k:  # MuSiQue's "#k" stands for the previous hop's answer, whose paragraph this is
                assert f"#{k}" in step["question"] and paragraph["title"] == steps[k - 1]["answer"]
        assert sum(p["is_supporting"] for p in row["paragraphs"]) == len(
            {s["paragraph_support_idx"] for s in steps}
        )
        assert sorted(titles) == sorted(world)  # one paragraph an entity
        assert row["answer"] not in row["question"]


def test_worlds_are_deterministic_and_train_and_test_never_share_one():
    assert make_row("x/1", 3) == make_row("x/1", 3)
    train = synthetic_rows("train", [2, 3], 200, seed=0)
    test = synthetic_rows("test", [2, 3], 50, seed=0)
    assert {r["seed"] for r in train}.isdisjoint({r["seed"] for r in test})
    assert [r["hops"] for r in train[:4]] == [2, 3, 2, 3]
    assert synthetic_rows("train", [2], 5, seed=1) != synthetic_rows("train", [2], 5, seed=0)


def test_search_ranks_by_bm25_and_read_finds_titles_and_both_record_what_was_shown():
    paragraphs = [
        {"title": "Kalo", "paragraph_text": "Kalo is a city on the Amber river.", "is_supporting": True},
        {"title": "Mira Tass", "paragraph_text": "Mira Tass was born in Kalo.", "is_supporting": True},
        {"title": "Vent", "paragraph_text": "Vent is a company based in Orra.", "is_supporting": False},
    ]
    corpus = Corpus(paragraphs)
    tools = corpus.tools()
    hits = tools["search"]("Where was Mira Tass born").splitlines()
    assert hits[0].startswith("Mira Tass: Mira Tass was born in Kalo.")
    assert "Vent" not in tools["search"]("Mira Tass")  # no shared word: BM25 score 0, not listed
    assert tools["search"]("???").startswith("Error")
    assert tools["search"]("zebra") == "No paragraph matches 'zebra'."
    assert tools["read"]("  kalo ") == "Kalo is a city on the Amber river."
    assert tools["read"]("Orra").startswith("No paragraph is titled 'Orra'")
    assert corpus.retrieved == ["Mira Tass", "Kalo"]
    assert support_reward(None, ["x"], [paragraphs], [corpus.retrieved]) == [1.0]
    assert support_reward(None, ["x"], [paragraphs], [["Kalo", "Vent"]]) == [0.5]


def test_answers_are_scored_as_squad_and_musique_score_them():
    assert final_answer("I read it.\nAnswer: Kalo") == "Kalo"
    assert normalize("The  Amber-River!") == "amberriver"
    assert exact_match("the Kalo.", "Kalo") == 1.0
    assert exact_match("Kalo city", "Kalo") == 0.0
    assert exact_match("Kalo, Orra", "Kalo", ["Kalo, Orra"]) == 1.0
    assert token_f1("Kalo city", "Kalo") == pytest.approx(2 * 0.5 * 1 / 1.5)  # precision 1/2, recall 1
    assert token_f1("new kalo", "kalo town", ["old new kalo"]) == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    assert token_f1("Orra", "Kalo") == 0.0
    assert exact_match_reward(["q", "q"], ["Kalo", "no"], ["Kalo", "Kalo"], [[], []]) == [1.0, 0.0]
    assert f1_reward(["q"], ["Kalo river"], ["Kalo"]) == [pytest.approx(2 / 3)]


def test_musique_rows_are_read_and_bad_ones_skipped_and_named(tmp_path):
    good = {
        "id": "2hop_1",
        "question": "Who founded the company based in Kalo?",
        "answer": "Mira Tass",
        "answer_aliases": ["M. Tass"],
        "answerable": True,
        "paragraphs": [
            {"idx": 0, "title": "Kalo", "paragraph_text": "Vent is based in Kalo.", "is_supporting": True},
            {
                "idx": 1,
                "title": "Vent",
                "paragraph_text": "Vent was founded by Mira Tass.",
                "is_supporting": True,
            },
        ],
        "question_decomposition": [
            {
                "id": 1,
                "question": "Which company is based in Kalo?",
                "answer": "Vent",
                "paragraph_support_idx": 0,
            }
        ],
    }
    lines = [
        json.dumps(good),
        json.dumps({**good, "answerable": False}),
        json.dumps({**good, "paragraphs": []}),
        "{broken",
        json.dumps({**good, "answer_aliases": "M. Tass"}),
    ]
    path = tmp_path / "musique.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rows, note = load_musique(str(path), "train")
    assert (
        len(rows) == 1 and rows[0]["prompt"] == good["question"] and rows[0]["answer_aliases"] == ["M. Tass"]
    )
    assert "skipped 4 bad row(s) of 5" in note and "unanswerable" in note and "no 'paragraphs' list" in note
    assert "line 2: unanswerable" in note and "line 4: malformed JSON" in note
    with pytest.raises(ValueError, match="line 2: unanswerable"):
        load_musique(str(path), "train", on_bad="error")
    assert load_musique(str(path), "test") == ([], None)
    with pytest.raises(ValueError, match="not found"):
        load_musique(str(tmp_path / "missing.jsonl"), "train")


def _config(tmp_path, **extra):
    settings = {"task": "multihop", "output": str(tmp_path / "run"), "eval_num_problems": 4, **extra}
    return build_config(settings, task_defaults=recommended_settings)


def test_the_task_loads_synthetic_rows_and_refuses_what_does_not_apply(tmp_path):
    # multihop_chains=[]: every chain, not the embedded tool model's one 2-hop chain
    task = load_task(_config(tmp_path, multihop_hops=[3], multihop_chains=[]))
    assert len(task.eval_rows) == 4 and {r["hops"] for r in task.train_rows + task.eval_rows} == {3}
    assert [w for w in task.reward_weights] == [1.0, 0.0, 0.0] and task.make_env is not None
    assert isinstance(task.make_env(task.eval_rows[0]), MultihopEnv)
    with pytest.raises(ConfigError, match="2, 3, 4 hops, not 5"):
        load_task(_config(tmp_path, multihop_hops=[5]))
    tools = tmp_path / "tools.py"
    tools.write_text("def f(x: str) -> str:\n    return x\n")
    with pytest.raises(ConfigError, match="brings its own tools"):
        load_task(_config(tmp_path, tools=str(tools)))


def test_chains_keep_one_kind_of_question_and_leave_the_other_rows_as_they_were(tmp_path):
    """multihop_chains ("city/country": company -> city -> country) as the tiny tool model trains on."""
    rows = [make_row(f"c/{i}", 2, ["city/country"]) for i in range(30)]
    assert all(
        r["question"].startswith("In which country is ") and r["question"].endswith(" based?") for r in rows
    )
    assert all(
        [s["question"].split()[0] for s in r["question_decomposition"]] == ["Where", "In"] for r in rows
    )
    # a row drawn without chains that happens to be of that chain is the same row
    plain = [make_row(f"c/{i}", 2) for i in range(30)]
    same = [p for p in plain if p["question"].endswith(" based?")]
    assert same and all(p == r for p, r in zip(plain, rows) if p["question"].endswith(" based?"))
    task = load_task(
        _config(tmp_path, multihop_chains=["city/country", "city/country/language"], multihop_hops=[2, 3, 4])
    )
    assert {r["hops"] for r in task.train_rows} == {2, 3}
    assert all(" based" in r["question"] for r in task.train_rows + task.eval_rows)
    with pytest.raises(ConfigError, match="'city/river' is not a chain of relations; one of founder/born_in"):
        load_task(_config(tmp_path, multihop_chains=["city/river"]))
    with pytest.raises(ConfigError, match="have none of \\[4\\] hops"):
        load_task(_config(tmp_path, multihop_chains=["city/country"], multihop_hops=[4]))


def test_musique_rows_come_in_through_data_and_each_episode_searches_only_its_own_paragraphs(tmp_path):
    rows = [make_row(f"m/{i}", 2) for i in range(12)]
    folder = tmp_path / "musique"
    folder.mkdir()
    (folder / "train.jsonl").write_text(
        "\n".join(json.dumps({k: v for k, v in r.items() if k != "prompt"}) for r in rows[:10]) + "\n"
    )
    (folder / "validation.jsonl").write_text("\n".join(json.dumps(r) for r in rows[10:]) + "\n")
    task = load_task(_config(tmp_path, data=str(folder)))
    assert [r["id"] for r in task.eval_rows] == [
        rows[10]["id"],
        rows[11]["id"],
    ]  # the folder's validation split
    # No test file: the train rows whose prompt and id hash into the test share are held out as test.
    test_ids = [r["id"] for r in task.test_rows]
    assert test_ids and len(task.train_rows) + len(test_ids) == 10
    assert not set(test_ids) & {r["id"] for r in task.train_rows}
    env = task.make_env(task.eval_rows[0])
    own = {p["title"] for p in task.eval_rows[0]["paragraphs"]}
    other = next(t for t in (p["title"] for p in rows[0]["paragraphs"]) if t not in own)
    assert env.corpus.tools()["read"](other).startswith("No paragraph is titled")


def test_an_episode_reads_two_hops_and_its_answer_is_scored(tmp_path, tiny_model_path):
    from mlx_grpo.models.loading import load_policy

    _, tokenizer = load_policy(str(tiny_model_path))
    row = make_row("e/0", 2)
    env = MultihopEnv(row, [exact_match_reward, f1_reward, support_reward], [1.0, 0.0, 0.5], None, 5.0)
    env.bind(tokenizer)
    assert '"name": "search"' in env.reset()
    first, second = row["question_decomposition"]
    start = row["paragraphs"][first["paragraph_support_idx"]]["title"]
    for title in (start, first["answer"]):
        observation, done, info = env.step(
            f'<tool_call>{{"name": "read", "arguments": {{"title": "{title}"}}}}</tool_call>'
        )
        assert not done and "<tool_response>" in observation
    assert info["tools/support_recall"] == 1.0 and not info["solved"]
    _, done, info = env.step(f"Answer: {row['answer']}")
    assert done and info["solved"] and info["tools/calls"] == 2
    assert env.reward() == 1.5 and env.reward_parts() == {
        "exact_match_reward": 1.0,
        "f1_reward": 1.0,
        "support_reward": 1.0,
    }
    env.reset()
    _, done, info = env.step("I do not know")
    assert (
        done
        and env.reward() == 0.0
        and info["tools/answered_without_call"]
        and info["tools/support_recall"] == 0.0
    )


def test_eval_on_multihop_reports_turns_and_tool_use(tmp_path, tiny_model_path):
    """`eval --task multihop`: the report carries the episodes' turns (and tool counts) beside the rewards."""
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(tiny_model_path),
            "--task",
            "multihop",
            "--n",
            "2",
            "--max-tokens",
            "4",
            "--output",
            str(tmp_path / "eval"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "exact_match_reward" in result.output and "turns" in result.output
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    (model,) = report["models"] if isinstance(report["models"], list) else report["models"].values()
    assert model["episode"]["episode/turns"] >= 1


def test_grpo_teaches_the_tiny_tool_model_to_read_both_hops(tmp_path):
    """The tiny tool model (scripts/build_tiny_tool_model.py) on city/country: read the company, read its
    city, answer the country. A short run of `mlx-grpo train --task multihop`'s own recipe raises the
    reward."""
    import numpy as np

    from mlx_grpo.run.trainer import train
    from rewards.multihop.tiny_model import tiny_tool_model

    if tiny_tool_model() is None:
        pytest.skip("the tiny tool model has not been built (scripts/build_tiny_tool_model.py)")
    config = build_config(
        {"task": "multihop", "output": str(tmp_path / "run"), "seed": 0, **TOOL_LEARNING_RUN},
        task_defaults=recommended_settings,
    )
    assert config.model == str(tiny_tool_model()) and config.task_options.multihop_chains == ["city/country"]
    result = train(config)
    reward = [m["reward/mean"] for m in result.history]
    calls = [m["tools/calls_per_episode"] for m in result.history]
    half = len(reward) // 2
    assert np.mean(reward[half:]) > np.mean(reward[:half]) + 0.1, reward
    assert np.mean(calls[half:]) > np.mean(calls[:half]), calls  # it learns to look things up
    assert result.accuracy_after > result.accuracy_before, (result.accuracy_before, result.accuracy_after)
    assert all(np.isfinite(m["grad_norm"]) and m["update/nonfinite"] == 0 for m in result.history)


# Short enough for the test suite; `mlx-grpo train --task multihop` runs the same recipe for longer.
TOOL_LEARNING_RUN = {"steps": 10, "eval_num_problems": 16}
