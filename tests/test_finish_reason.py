"""Rewards learn whether a completion was cut at max_tokens, wherever completions are scored.

A reward that asks for `finish_reason` (GSM8K's correctness, OCaml's grading) must get the
same column in training, in the trainer's held-out check and in eval/compare: a scorer that
saw it in only some of them would give one answer two scores.
"""

import json

from mlx_grpo.config import build_config
from mlx_grpo.run.trainer import train
from mlx_grpo.tasks.data import columns_of

REWARDS = """
import json, os

def seen(prompts, completions, finish_reason=None, **kwargs):
    with open(os.environ["SEEN_FILE"], "a") as f:
        f.write(json.dumps({"reasons": finish_reason, "n": len(completions)}) + "\\n")
    return [1.0 if r == "stop" else 0.0 for r in (finish_reason or [None] * len(completions))]
"""


def test_columns_of_adds_the_finish_reason_of_each_completion():
    class Done:
        def __init__(self, reason):
            self.finish_reason = reason

    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    columns = columns_of(rows, 2, [Done("stop"), Done("length"), Done("length"), Done("stop")])
    assert columns == {"answer": ["1", "1", "2", "2"], "finish_reason": ["stop", "length", "length", "stop"]}
    assert "finish_reason" not in columns_of(rows, 2)
    assert columns_of([{"prompt": "a", "finish_reason": "x"}], 1, [Done("stop")])["finish_reason"] == ["x"]


def test_training_and_the_held_out_check_pass_it_to_rewards(tmp_path, tiny_model_path, monkeypatch):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(40)))
    (tmp_path / "rewards.py").write_text(REWARDS)
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("SEEN_FILE", str(seen))
    config = build_config(
        dict(
            model=str(tiny_model_path),
            data=str(data),
            reward_file=str(tmp_path / "rewards.py"),
            reward=["seen"],
            steps=2,
            batch_size=2,
            group_size=4,
            max_tokens=3,
            seed=0,
            eval_num_problems=4,
            output=str(tmp_path / "run"),
        )
    )
    train(config)
    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(calls) >= 4  # before, two steps, after
    for call in calls:
        assert call["reasons"] is not None and len(call["reasons"]) == call["n"]
        assert set(call["reasons"]) <= {"stop", "length"}
    assert any("length" in call["reasons"] for call in calls)  # 3 tokens: the random model is cut
