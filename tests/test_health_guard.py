"""The non-finite guard in a real run: injected NaN losses skip their updates, then stop the run with its
last good checkpoint intact; a resumed run reports the same health events as one that ran straight."""

import inspect
import json

import mlx.core as mx
import numpy as np
import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.files import training_rows
from mlx_grpo.run import trainer
from mlx_grpo.update import step as update_step


REWARDS = """
def variety(prompts, completions, **kw):
    return [len(set(c)) / 10 for c in completions]
"""


def test_injected_nan_skips_updates_then_stops_with_last_good_checkpoint(
    tmp_path, tiny_model_path, monkeypatch
):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(40)))
    rewards = tmp_path / "rewards.py"
    rewards.write_text(REWARDS)
    poison = {"on": False}
    real_loss, real_step = update_step.policy_loss, trainer.train_step

    def nan_loss(*args, **kwargs):
        loss, stats = real_loss(*args, **kwargs)
        return (loss * float("nan"), stats) if poison["on"] else (loss, stats)

    def step_from_3(*args, **kwargs):
        step = inspect.signature(real_step).bind(*args, **kwargs).arguments["step"]
        poison["on"] = step >= 3
        return real_step(*args, **kwargs)

    monkeypatch.setattr(update_step, "policy_loss", nan_loss)
    monkeypatch.setattr(trainer, "train_step", step_from_3)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            str(tiny_model_path),
            "--data",
            str(data),
            "--reward-file",
            str(rewards),
            "--reward",
            "variety",
            "--steps",
            "6",
            "--batch-size",
            "2",
            "--group-size",
            "4",
            "--max-tokens",
            "8",
            "--lr",
            "1e-2",
            "--save-every",
            "1",
            "--keep-checkpoints",
            "10",
            "--warmup-steps",
            "0",
            "--max-nonfinite-steps",
            "2",
            "--output",
            str(run_dir),
        ],
    )
    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), (
        result.exception
    )
    assert "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert "stopped at step 4" in last and "step_000003" in last

    metrics = training_rows([json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()])
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert [m["skipped_updates"] for m in metrics] == [0, 0, 1, 1]
    assert [m["update/skipped"] for m in metrics] == [False, False, True, True]  # the same skips, as a flag
    assert [m["update/nonfinite"] for m in metrics] == [0, 0, 1, 1]
    assert metrics[0]["update/rel_change"] > 0 and metrics[2]["update/rel_change"] == 0
    events = [json.loads(x) for x in (run_dir / "health.jsonl").read_text().splitlines()]
    assert [(e["step"], e["rule"]) for e in events if e["rule"] == "nonfinite"] == [
        (3, "nonfinite"),
        (4, "nonfinite"),
    ]
    assert json.loads((run_dir / "summary.json").read_text())["stopped"] is True

    ckpts = run_dir / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_000003" and not (ckpts / "step_000004").exists()
    good = mx.load(str(ckpts / "step_000002" / "adapters.safetensors"))
    kept = mx.load(str(ckpts / "step_000003" / "adapters.safetensors"))
    assert good.keys() == kept.keys()
    for name in good:  # the skipped update left the weights exactly as they were
        assert np.array_equal(np.array(good[name]), np.array(kept[name])), name
        assert np.isfinite(np.array(kept[name])).all()


def test_resumed_run_reports_the_same_health_events(tmp_path, tiny_model_path):
    """The monitor catches up on metrics.jsonl when resuming: no event twice, none lost."""
    from mlx_grpo.config import build_config

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}", "answer": str(i)}) + "\n" for i in range(40)))
    rewards = tmp_path / "rewards.py"
    rewards.write_text(REWARDS)

    def config(out, **more):
        # Thresholds set so that rules fire on a few steps of a tiny run.
        return build_config(
            dict(
                model=str(tiny_model_path),
                data=str(data),
                reward_file=str(rewards),
                reward=["variety"],
                steps=6,
                batch_size=2,
                group_size=4,
                max_tokens=8,
                lr=1e-2,
                save_every=3,
                seed=3,
                output=str(out),
                warmup_steps=0,
                health_window=2,
                health_clip_frac=0.0,
                health_zero_std=0.0,
                health_min_update=1.0,
                **more,
            )
        )

    trainer.train(config(tmp_path / "straight"))

    class Interrupt(Exception):
        pass

    def stop_at_3(kind, data):
        if kind == "checkpoint" and data["step"] == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        trainer.train(config(tmp_path / "resumed"), on_event=stop_at_3)
    trainer.train(config(tmp_path / "resumed", resume=str(tmp_path / "resumed")))

    straight = (tmp_path / "straight" / "health.jsonl").read_text().splitlines()
    resumed = (tmp_path / "resumed" / "health.jsonl").read_text().splitlines()
    assert len(straight) >= 2 and resumed == straight
