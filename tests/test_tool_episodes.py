"""Tool episodes (sampling/tool_env.py) on the multi-turn path: results inserted as the template writes
them, every tool-result token masked out of the loss, behaviour log-probs equal to a full forward pass."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.config import TrainConfig
from mlx_grpo.models.loading import load_policy
from mlx_grpo.run.step_update import update_settings
from mlx_grpo.tools import episode as tool_env
from mlx_grpo.sampling.environment import Rendered
from mlx_grpo.sampling.multiturn import rollout_episodes
from mlx_grpo.sampling.rollout import SamplingConfig
from mlx_grpo.tools.calls import ToolCall
from mlx_grpo.update.batch import build_batch
from mlx_grpo.update.logprobs import token_logprobs
from mlx_grpo.update.losses import BatchShape, policy_loss

ROW = {"prompt": "What is the capital of Norway?", "answer": "Oslo"}


def lookup(title: str) -> str:
    """Read a page.

    Args:
        title: the page's title
    """
    return {"Norway": "Norway's capital is Oslo."}.get(title, f"no page {title!r}")


def exact(prompts, completions, answer, **kw):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


@pytest.fixture()
def policy(tiny_model_path):
    return load_policy(str(tiny_model_path))


def test_an_episode_calls_reads_and_answers(policy):
    env = tool_env.ToolEnv(ROW, {"lookup": lookup}, policy[1], [exact])
    first = env.reset()
    assert isinstance(first, Rendered) and '"name": "lookup"' in first and first.endswith("assistant\n")
    observation, done, info = env.step(
        '<tool_call>{"name": "lookup", "arguments": {"title": "Norway"}}</tool_call>'
    )
    assert not done and "<tool_response>\nNorway's capital is Oslo.\n</tool_response>" in observation
    observation, done, info = env.step(
        '<tool_call>{"name": "lookup", "arguments": {"page": 3}}</tool_call><tool_call>{"name": </tool_call>'
    )
    assert "Error: lookup has no argument 'page'" in observation and "not valid JSON" in observation
    assert (info["tools/calls"], info["tools/invalid"], info["tools/parse"]) == (3, 1, 1)
    _, done, info = env.step("The capital is Oslo.")
    assert done and env.reward() == 1.0 and not info["tools/answered_without_call"]


def test_tool_results_are_masked_and_logprobs_match_a_full_forward_pass(policy, monkeypatch):
    model, tokenizer = policy
    envs = [tool_env.ToolEnv(ROW, {"lookup": lookup}, tokenizer, [exact]) for _ in range(4)]
    calls = {id(env): 2 for env in envs}  # each episode's first two turns are calls

    def parse(text, style="hermes"):
        env = parse.current
        if calls[id(env)] > 0:
            calls[id(env)] -= 1
            return [ToolCall("lookup", {"title": "Norway"}, None, text)]
        return []

    real_step = tool_env.ToolEnv.step

    def step(self, action):
        parse.current = self
        return real_step(self, action)

    monkeypatch.setattr(tool_env, "parse_calls", parse)
    monkeypatch.setattr(tool_env.ToolEnv, "step", step)
    episodes = rollout_episodes(
        model, tokenizer, envs, 2, SamplingConfig(1.0, max_tokens=10), 4, 400, None, seed=3
    )
    for ep in episodes:
        assert ep.observations and len(ep.turns) >= 2
        mask = np.array(ep.mask)
        inserted = tokenizer.decode([t for t, m in zip(ep.tokens, mask) if m == 0])
        assert inserted.count("<tool_response>\nNorway's capital is Oslo.\n</tool_response>") == len(
            ep.observations
        )
        # The trained tokens are the turns it wrote: one run of them per turn, in order (decoded run by
        # run, since a byte-level turn may end inside a character that the next turn's bytes would complete).
        runs, run = [], []
        for t, m in zip(ep.tokens, mask):
            if m == 1:
                run.append(t)
            elif run:
                runs, run = runs + [run], []
        runs += [run] if run else []
        assert len(runs) == len(ep.turns)
        assert all(turn in tokenizer.decode(r) for turn, r in zip(ep.turns, runs))
        logp, _ = token_logprobs(model, mx.array([ep.prompt_tokens + ep.tokens]))
        forward = np.array(logp[0, len(ep.prompt_tokens) - 1 :])
        np.testing.assert_allclose(np.array(ep.logprobs)[mask == 1], forward[mask == 1], atol=1e-4)
    # The loss sees no tool-result token: its gradient there is exactly zero.
    batch = build_batch(episodes, np.array([1.0, -1.0, 0.5, -0.5]), 2)
    logp = mx.array(batch.behaviour_logp)
    shape = BatchShape(
        num_sequences=4,
        num_tokens=int(batch.mask.sum()),
        num_micro_batches=1,
        max_tokens=batch.completions.shape[1],
    )
    grad = mx.grad(
        lambda lp: policy_loss(
            lp,
            mx.array(batch.behaviour_logp),
            mx.array(batch.advantages),
            mx.array(batch.mask),
            shape,
            update_settings(TrainConfig()).loss,
        )[0]
    )(logp)
    grad = np.array(grad)
    assert np.all(grad[batch.mask == 0] == 0) and np.abs(grad[batch.mask == 1]).max() > 0
    assert (batch.mask == 0).sum() > 0


def test_train_and_eval_with_tools_from_the_command_line(tmp_path, tiny_model_path):
    """--tools FILE.py: every row a tool episode, through train and eval; a broken tools file is one line."""
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(f'{{"prompt": "What is the capital of page {i}?", "answer": "Oslo"}}\n' for i in range(12))
    )
    (tmp_path / "rewards.py").write_text(
        "def exact(prompts, completions, answer, **kw):\n"
        "    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]\n"
    )
    (tmp_path / "tools.py").write_text(
        "def lookup(title: str) -> str:\n    '''Read a page.'''\n    return 'Oslo'\n"
    )
    common = [
        "--model",
        str(tiny_model_path),
        "--task",
        "custom",
        "--data",
        str(data),
        "--reward-file",
        str(tmp_path / "rewards.py"),
        "--reward",
        "exact",
        "--max-tokens",
        "8",
    ]
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "train",
            *common,
            "--tools",
            str(tmp_path / "tools.py"),
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--max-turns",
            "2",
            "--eval-num-problems",
            "2",
            "--output",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "tools: " in (tmp_path / "run" / "config.yaml").read_text()
    (tmp_path / "bad.py").write_text("import not_a_module\n")
    result = runner.invoke(
        app,
        [
            "train",
            *common,
            "--tools",
            str(tmp_path / "bad.py"),
            "--steps",
            "1",
            "--output",
            str(tmp_path / "bad-run"),
        ],
    )
    assert result.exit_code != 0 and "importing it raised ModuleNotFoundError" in result.output
    assert "Traceback" not in result.output


def test_a_template_whose_calls_no_style_reads_is_one_line_from_the_command(tmp_path, tiny_model_path):
    """A model whose template teaches <function=...> XML calls (Qwen3-Coder's kind) stops before any
    rollout."""
    import json
    import shutil

    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    model = tmp_path / "xml-model"
    shutil.copytree(tiny_model_path, model)
    settings = json.loads((model / "tokenizer_config.json").read_text())
    settings["chat_template"] = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if tools %}Call as <function=NAME><parameter=ARG>value</parameter></function>"
        "{% endif %}"
    )
    (model / "tokenizer_config.json").write_text(json.dumps(settings))
    (tmp_path / "tools.py").write_text(
        'def lookup(title: str) -> str:\n    """Read a page."""\n    return "Oslo"\n'
    )
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"prompt": "Capital of page {i}?", "answer": "Oslo"}}\n' for i in range(4)))
    (tmp_path / "rewards.py").write_text(
        "def exact(prompts, completions, answer, **kw):\n"
        "    return [float(a in c) for c, a in zip(completions, answer)]\n"
    )
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            str(model),
            "--task",
            "custom",
            "--data",
            str(data),
            "--reward-file",
            str(tmp_path / "rewards.py"),
            "--reward",
            "exact",
            "--tools",
            str(tmp_path / "tools.py"),
            "--max-tokens",
            "4",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--output",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "teaches tool calls as <function=NAME>" in result.output and "Traceback" not in result.output
