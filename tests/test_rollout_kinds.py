"""Single- or multi-turn is told apart once (sampling/kinds.py): run/ and evaluation/ never read
`make_env`, and each kind's prompt.txt is exactly the prompt its rollouts were sampled from."""

import ast
from pathlib import Path

from mlx_grpo.config import build_config
from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling.kinds import MultiTurn, SingleTurn, rollouts_for
from mlx_grpo.run.step_rollouts import rollout_settings
from mlx_grpo.run.task_setup import load_task

PACKAGE = Path(__file__).resolve().parent.parent / "mlx_grpo"


def _reads_make_env(path: Path) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr == "make_env"
        or isinstance(node, ast.Constant)
        and node.value == "make_env"
    ]


def test_run_and_evaluation_never_tell_the_kinds_apart_themselves():
    assert _reads_make_env(PACKAGE / "sampling" / "kinds.py")  # the one place that chooses (the scan sees it)
    found = {
        str(p.relative_to(PACKAGE)): lines
        for folder in ("run", "evaluation")
        for p in sorted((PACKAGE / folder).rglob("*.py"))
        if (lines := _reads_make_env(p))
    }
    assert found == {}


def _config(tiny_model_path, task, **settings):
    return build_config(
        {
            "model": str(tiny_model_path),
            "task": task,
            "group_size": 2,
            "max_tokens": 4,
            "eval_num_problems": 2,
            **settings,
        }
    )


def test_each_kind_samples_from_the_prompt_it_shows(tiny_model_path):
    model, tokenizer = load_policy(str(tiny_model_path))
    for name, kind, extra in (("arith", SingleTurn, {}), ("web", MultiTurn, {"max_turns": 1})):
        config = _config(tiny_model_path, name, **extra)
        task = load_task(config)
        rollouts = rollouts_for(task)
        assert type(rollouts) is kind and rollouts.plays_episodes == (kind is MultiTurn)
        rows = task.train_rows[:1]
        sampled, scores, _ = rollouts.sample_and_score(
            model, tokenizer, rows, rollout_settings(config), seed=5
        )
        assert len(sampled) == 2 and len(scores.total) == 2
        assert rollouts.prompt_as_seen(tokenizer, rows[0]) == tokenizer.decode(sampled[0].prompt_tokens), name
        assert set(rollouts.record(tokenizer, sampled[0])) == (
            {"turns", "segments"} if kind is MultiTurn else set()
        )


def test_sampling_is_given_its_settings_not_the_config():
    """sampling/ takes RolloutSettings (run/step_rollouts.rollout_settings fills it), never the whole
    TrainConfig."""
    importers = sorted(
        str(p.relative_to(PACKAGE))
        for p in (PACKAGE / "sampling").rglob("*.py")
        if any(
            isinstance(n, ast.ImportFrom) and (n.module or "").endswith("config") and n.level
            for n in ast.walk(ast.parse(p.read_text()))
        )
    )
    assert importers == []
    config = build_config({"group_size": 3, "temperature": 0.5, "eval_pass_k": 2, "max_turns": 4, "seed": 9})
    settings = rollout_settings(config)
    assert (
        settings.group_size,
        settings.sampling.temperature,
        settings.eval_pass_k,
        settings.max_turns,
        settings.seed,
        settings.concurrency,
    ) == (3, 0.5, 2, 4, 9, config.decode_concurrency)
