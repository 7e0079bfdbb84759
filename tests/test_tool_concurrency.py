"""The tool calls of one turn run at once across a group's episodes: four episodes'
calls meet at a barrier that only four calls in flight together can pass."""

import threading

from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling.multiturn import rollout_episodes
from mlx_grpo.sampling.rollout import SamplingConfig
from mlx_grpo.tools import episode as tool_env
from mlx_grpo.tools.calls import ToolCall


def test_the_calls_of_a_turn_run_concurrently_across_episodes(tiny_model_path, monkeypatch):
    model, tokenizer = load_policy(str(tiny_model_path))
    barrier = threading.Barrier(4, timeout=20)
    passed = []

    def meet(place: str) -> str:
        """Wait for the other episodes' calls.

        Args:
            place: where
        """
        barrier.wait()  # BrokenBarrierError (the call's error result) unless 4 calls are in flight at once
        passed.append(place)
        return "met"

    turn = {}

    def parse(text, style="hermes"):  # each episode calls once, then answers
        return [] if turn.get(text) else [ToolCall("meet", {"place": "here"}, None, text)]

    real_step = tool_env.ToolEnv.step

    def step(self, action):
        result = real_step(self, action)
        turn[action] = True
        return result

    monkeypatch.setattr(tool_env, "parse_calls", parse)
    monkeypatch.setattr(tool_env.ToolEnv, "step", step)
    envs = [
        tool_env.ToolEnv({"prompt": f"q{i}", "answer": "a"}, {"meet": meet}, tokenizer, [], timeout=30)
        for i in range(4)
    ]
    episodes = rollout_episodes(
        model, tokenizer, envs, 1, SamplingConfig(0.0, max_tokens=4), 2, 200, None, seed=0
    )
    assert len(passed) == 4
    assert all(ep.info["tools/raised"] == 0 and "met" in ep.observations[0] for ep in episodes)
