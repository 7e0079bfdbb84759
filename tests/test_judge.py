"""The judge reward (rewards/judge.py): the score parser on hand-worked answers, rubrics and
what they show the judge, one batched judge decode a call, the cache, bad inputs as one
line, and a whole `train --judge embedded` run."""

import json

import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.files import training_rows
from rewards import judge as judge_module
from rewards.judge import (
    JudgeError,
    builtin_rubrics,
    judge_prompts,
    load_rubric,
    make_judge_reward,
    parse_rubric,
    parse_score,
)


# (answer, score on the 1-10 scale mapped to [0, 1]) worked out by hand: (v - 1) / 9
@pytest.mark.parametrize(
    "answer, expected",
    [
        ("Score: 7", 6 / 9),
        ("score: 10", 1.0),
        ("Score: 1", 0.0),
        ("**Score:** 8", 7 / 9),
        ("Rating: 4 out of 10", 3 / 9),
        ("The code is clear.\nScore: 5/10", 4 / 9),
        ("My score is 9.", 8 / 9),
        ("a score of 3 out of 10", 2 / 9),
        ("7", 6 / 9),
        ("7/10\nIt handles the empty list.", 6 / 9),
        ("  5.5 ", 4.5 / 9),
        ("Score: 6. Score: 6/10", 5 / 9),  # two scores that agree
        ("Score: 10\n\nThe response is correct, but it is not helpful,", 1.0),  # SmolLM2-135M's, verbatim
        # unreadable: None, never a guess
        ("", None),
        ("   \n  ", None),
        ("I think it is quite good", None),
        ("3 + 4 = 7\n#### 7", None),  # numbers, but no score
        ("#### 8", None),
        ("Score: N", None),  # SmolLM2-135M's when the rubric said 'Reply with "Score: N"'
        ("Score: 11", None),  # off the scale
        ("Score: 0", None),
        ("Score: -3", None),
        ("Score: 3/5", None),  # another scale than the rubric's
        ("Score: 3. On reflection, score: 8", None),  # disagrees with itself
        ("seven", None),
        ("Score: \u0667", None),  # an Arabic-Indic digit is not read as 7
        (None, None),
        (7, None),
    ],
)
def test_parse_score_hand_worked(answer, expected):
    got = parse_score(answer, (1, 10))
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_parse_score_other_scales():
    assert parse_score("Score: 3", (0, 4)) == pytest.approx(0.75)
    assert parse_score("Score: 0", (0, 4)) == 0.0
    assert parse_score("3/4", (0, 4)) == pytest.approx(0.75)
    assert parse_score("3/10", (0, 4)) is None


def test_rubric_scale_line_and_fields():
    rubric = parse_rubric(
        "scale: 0-4\nGrade {completion} for {prompt}; compare with {answer}. {{literal}} { x }\n"
    )
    assert rubric.scale == (0.0, 4.0)
    assert rubric.fields == ["completion", "prompt", "answer"] and rubric.columns == ["answer"]
    assert not rubric.template.startswith("scale")
    assert parse_rubric("Grade {completion}").scale == (1.0, 10.0)


def test_rubric_may_write_the_start_of_the_answer():
    rubric = parse_rubric("answer starts: Score:\nscale: 0-4\nGrade {completion}.")
    assert (
        rubric.answer_start == "Score:"
        and rubric.scale == (0.0, 4.0)
        and rubric.template == "Grade {completion}.\n"
    )
    assert parse_rubric("Grade {completion}.").answer_start == ""


def test_the_written_start_ends_each_judge_prompt_and_begins_each_answer(monkeypatch):
    judge = make_judge_reward("embedded", parse_rubric("answer starts: Score:\nGrade {completion}."))
    start = judge.tokenizer.encode("Score:", add_special_tokens=False)
    seen = []
    real = judge_module.sample_completions

    def capture(model, tokenizer, prompts, *args, **kwargs):
        seen.extend(prompts)
        return real(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(judge_module, "sample_completions", capture)
    judge(["p", "p"], ["#### 7", "#### 8"])
    assert len(seen) == 2 and all(p[-len(start) :] == start for p in seen)
    assert all(answer.startswith("Score:") for _, answer in judge.answers.values())


def test_builtin_rubrics_load_and_need_only_prompt_and_completion():
    assert {"general", "ocaml_quality"} <= set(builtin_rubrics())
    for name in builtin_rubrics():
        rubric = load_rubric(name)
        assert rubric.columns == [] and "completion" in rubric.fields and rubric.scale == (1.0, 10.0)
        assert rubric.answer_start == "Score:" and not rubric.template.startswith(("scale", "answer"))


def test_judge_sees_no_column_the_rubric_does_not_name():
    prompts, completions = ["What is 6 x 7?"] * 2, ["It is 41.", "{answer}"]
    columns = {"answer": ["SECRET-42", "SECRET-42"], "id": ["p1", "p1"]}
    hidden = judge_prompts(
        parse_rubric("Q: {prompt}\nA: {completion}\nScore it."), prompts, completions, columns
    )
    assert hidden[0] == "Q: What is 6 x 7?\nA: It is 41.\nScore it.\n"
    assert all("SECRET" not in text for text in hidden)
    # a completion that writes "{answer}" is shown as written, not filled in
    assert "A: {answer}\n" in hidden[1]
    shown = judge_prompts(
        parse_rubric("{completion}\nreference: {answer} {{x}}"), prompts, completions, columns
    )
    assert shown[0] == "It is 41.\nreference: SECRET-42 {x}\n"
    chat = judge_prompts(
        parse_rubric("{prompt}|{completion}"), [[{"role": "user", "content": "hi"}]], ["yo"], {}
    )
    assert chat == ["user: hi|yo\n"]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("Rate the answer to {prompt}.", "has no {completion}"),
        ("scale: 10-1\n{completion}", "low end must be below"),
    ],
)
def test_bad_rubric_text(text, fragment):
    with pytest.raises(JudgeError, match=fragment):
        parse_rubric(text)


def test_unreadable_rubric_files(tmp_path):
    with pytest.raises(JudgeError, match="not found"):
        load_rubric(str(tmp_path / "missing.txt"))
    with pytest.raises(JudgeError, match="cannot be read"):
        load_rubric(str(tmp_path))  # a folder
    binary = tmp_path / "rubric.bin"
    binary.write_bytes(b"\xff\xfe{completion}\x00\x81")
    with pytest.raises(JudgeError, match="not UTF-8"):
        load_rubric(str(binary))


def test_a_judge_that_cannot_load(tmp_path):
    with pytest.raises(JudgeError, match="could not be loaded"):
        make_judge_reward(str(tmp_path / "no-such-model"), "general")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(JudgeError, match="could not be loaded"):
        make_judge_reward(str(broken), "general")


class CountingSampler:
    """Wraps the rollout sampler: counts the judge's decodes and the prompts in each."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = judge_module.sample_completions

        def counted(model, tokenizer, prompts, *args, **kwargs):
            self.calls.append(len(prompts))
            return real(model, tokenizer, prompts, *args, **kwargs)

        monkeypatch.setattr(judge_module, "sample_completions", counted)


def test_one_batched_decode_per_call_and_the_cache(monkeypatch):
    sampler = CountingSampler(monkeypatch)
    judge = make_judge_reward("embedded", "Answer {completion} to {prompt}\nScore:")
    prompts = ["Ann has 3 pens. She buys 4 more. How many pens does she have now?"] * 6
    completions = ["#### 7", "#### 8", "#### 7", "3 + 4 = 7\n#### 7", "#### 8", "#### 1"]
    first = judge(prompts, completions)
    assert sampler.calls == [4]  # one decode, each distinct (prompt, completion) once
    assert len(first) == 6 and first[0] == first[2] and first[1] == first[4]
    metrics = judge.pop_metrics()
    assert metrics["judge/decoded"] == 4 and metrics["time/judge_s"] > 0
    assert metrics["judge/unreadable_frac"] == pytest.approx(sum(s is None for s in first) / 6)
    again = judge(prompts[:3], completions[:3])
    assert sampler.calls == [4] and again == first[:3]  # all cached: no decode
    assert judge.pop_metrics()["judge/decoded"] == 0
    assert judge.pop_metrics() == {}  # nothing judged since


def test_scores_follow_the_judges_answers(monkeypatch):
    """With the decode replaced by known answers: each completion gets its own answer's score."""
    judge = make_judge_reward("embedded", "{completion}")
    asked = []

    table = {"good\n": "Score: 10", "fine\n": "6/10", "bad\n": "Score: 1", "odd\n": "hmm"}

    def answers(texts):
        asked.append(list(texts))
        return [table[t] for t in texts]

    monkeypatch.setattr(judge, "generate", answers)
    scores = judge(["p"] * 5, ["good", "odd", "bad", "good", "fine"])
    assert scores == [1.0, None, 0.0, 1.0, pytest.approx(5 / 9)]
    assert asked == [["good\n", "odd\n", "bad\n", "fine\n"]]
    metrics = judge.pop_metrics()
    assert (
        metrics["judge/unreadable_frac"] == pytest.approx(0.2)
        and metrics["judge/unreadable_example"] == "hmm"
    )


def test_the_judge_model_loads_once():
    first = make_judge_reward("embedded", "general")
    second = make_judge_reward("embedded", "ocaml_quality")
    assert first.model is second.model


def _fail_line(result):
    lines = [line for line in result.output.splitlines() if line.strip()]
    return result.exit_code, lines


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--judge", "/no/such/judge"], "could not be loaded"),
        (["--judge", "embedded", "--judge-rubric", "/no/such/rubric.txt"], "rubric file not found"),
        (["--judge", "embedded", "--judge-rubric", "RUBRIC_WITHOUT_COMPLETION"], "has no {completion}"),
        (["--judge", "embedded", "--judge-rubric", "RUBRIC_NAMING_A_MISSING_COLUMN"], "no 'verdict' column"),
        (["--judge-rubric", "general"], "needs --judge"),
        (["--task", "web", "--judge", "embedded"], "--judge does not apply"),
    ],
)
def test_bad_judge_settings_stop_before_training(tmp_path, extra, fragment):
    (tmp_path / "no_completion.txt").write_text("Rate {prompt}.")
    (tmp_path / "verdict.txt").write_text("{completion} vs {verdict}")
    extra = [
        str(tmp_path / "no_completion.txt")
        if e == "RUBRIC_WITHOUT_COMPLETION"
        else str(tmp_path / "verdict.txt")
        if e == "RUBRIC_NAMING_A_MISSING_COLUMN"
        else e
        for e in extra
    ]
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--steps", "1", "--output", str(out), *extra])
    code, lines = _fail_line(result)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], (
        result.output
    )
    assert not (out / "metrics.jsonl").exists()


def test_train_with_the_embedded_model_as_policy_and_judge(tmp_path, monkeypatch):
    sampler = CountingSampler(monkeypatch)
    out, rubric = tmp_path / "run", tmp_path / "short.txt"
    rubric.write_text("Grade {completion}")  # the built-in ones do not fit the embedded model's 256 positions
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--judge",
            "embedded",
            "--judge-rubric",
            str(rubric),
            "--judge-weight",
            "0.5",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--max-tokens",
            "16",
            "--eval-num-problems",
            "2",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert len(sampler.calls) == 2  # one judge decode a step
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    for m in training_rows(steps):
        mine = [r["rewards"]["judge"] for r in records if r["step"] == m["step"]]
        assert len(mine) == 4 and m["time/judge_s"] > 0 and m["judge/decoded"] == sampler.calls[m["step"] - 1]
        assert m["judge/unreadable_frac"] == pytest.approx(sum(v is None for v in mine) / 4)
    # the judge's weight is in the total: reward = correctness + 0.5 * judge (before the length penalty)
    for r in records:
        judged = r["rewards"]["judge"]
        expected = r["rewards"]["correctness_reward"] + (0.5 * judged if judged is not None else 0.0)
        assert r["raw_reward"] == pytest.approx(expected)


def test_eval_reports_the_judge_beside_accuracy(tmp_path):
    out, rubric = tmp_path / "eval", tmp_path / "short.txt"
    rubric.write_text("Grade {completion}")
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            "embedded",
            "--judge",
            "embedded",
            "--judge-rubric",
            str(rubric),
            "--n",
            "6",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())["models"]["model"]
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    judged = [row["model"]["parts"]["judge"][0] for row in rows]
    readable = [v for v in judged if v is not None]
    assert report["accuracy"] is not None and "judge" in report["reward_parts"]
    assert report["reward_parts"]["judge"] == (
        pytest.approx(sum(readable) / len(readable)) if readable else None
    )
    unreadable = sum(v is None for v in judged) / len(judged)
    assert f"| &nbsp;&nbsp;judge unreadable | {unreadable:.3f} |" in (out / "report.md").read_text()


def test_paired_judge_scores_leave_out_prompts_without_a_score():
    from mlx_grpo.stats import compare_paired, compare_paired_part, paired_parts

    # 2 samples a prompt; the second prompt has no base score, the fourth no trained score
    base = [0.2, 0.4, None, None, 0.5, 0.5, 0.1, 0.3, 0.0, 1.0]
    trained = [0.6, 0.6, 0.9, 0.9, 0.7, None, None, None, 0.4, 0.8]
    got = compare_paired_part(base, trained, 2, "judge")
    expected = compare_paired([0.3, 0.5, 0.5], [0.6, 0.7, 0.6], "judge", binary=False)
    assert got.n == 3 and got.difference == pytest.approx(expected.difference) == pytest.approx(0.2)
    assert got.p_value == expected.p_value and (got.wins, got.losses) == (3, 0)
    assert compare_paired_part([None, None], [0.5, 0.5], 1, "judge") is None
    assert paired_parts({"judge": base, "x": base}, {"judge": trained, "x": trained}, 2)["judge"] == got
    assert paired_parts({"judge": [None]}, {"judge": [0.5]}, 1) == {} == paired_parts({}, {"judge": [0.5]}, 1)


def test_rubrics_ship_as_package_data():
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "rewards"
    ]
    for name in builtin_rubrics():
        assert any(fnmatch.fnmatch(f"rubrics/{name}.txt", p) for p in patterns), name


def test_bench_judge_reports_time_against_the_rollout_and_memory(capsys):
    import importlib.util
    from pathlib import Path

    from mlx.utils import tree_flatten

    from mlx_grpo.models.loading import load_policy

    spec = importlib.util.spec_from_file_location(
        "bench_judge", Path(__file__).resolve().parents[1] / "scripts" / "bench_judge.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    summary = bench.main(["--steps", "2", "--batch-size", "2", "--group-size", "2", "--max-tokens", "8"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[-1] == summary and [s["step"] for s in lines[:-1]] == [1, 2]
    assert (
        summary["rollout_s"] == lines[1]["rollout_s"] and summary["judge_s"] == lines[1]["judge_s"]
    )  # step 1 compiles
    assert summary["judge_over_rollout"] == pytest.approx(summary["judge_s"] / summary["rollout_s"])
    embedded, _ = load_policy(None)
    assert summary["judge_weights_gb"] == sum(v.nbytes for _, v in tree_flatten(embedded.parameters())) / 1e9
    assert all(0 <= s["unreadable_frac"] <= 1 and s["completion_tokens"] > 0 for s in lines[:-1])


def test_a_judge_prompt_past_the_judges_context_is_not_judged(monkeypatch):
    sampler = CountingSampler(monkeypatch)
    judge = make_judge_reward("embedded", "Grade {completion}")  # the embedded model's context: 256 positions
    scores = judge(["p", "p"], ["#### 7", "seven " * 300])
    assert sampler.calls == [1] and scores[1] is None  # only the short one was decoded
    short, long = [answer for _, answer in judge.answers.values()]
    assert "pass the judge's context of 256" in long and "not judged" not in short
    assert parse_score(short) == scores[0]
