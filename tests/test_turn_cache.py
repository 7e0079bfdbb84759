"""Episodes keep their keys and values between turns (sampling/turn_cache.py, turns.py).

The oracle is the way it was done before (reuse_cache=False: every turn prefills the
whole conversation again) and one full forward pass over each finished episode, as the
update computes its log-probs. A wrong slot, mask, RoPE position or a token fed twice
moves the recorded log-probs well past the tolerances here (1e-4).
"""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import gemma3_text

from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling import fixed_decode, turn_cache, turns
from mlx_grpo.sampling.multiturn import rollout_episodes
from mlx_grpo.sampling.rollout import SamplingConfig
from mlx_grpo.sampling.turns import FixedTurns, GeneratorTurns, Reprefill, Stats, player_for
from mlx_grpo.sampling.width import decode_width, kv_bytes_per_token
from mlx_grpo.update.logprobs import token_logprobs
from rewards.web_browsing import WebEnv, make_task
from rewards.web_browsing.tiny_model import tiny_web_model


class VaryingEnv:
    """Observations whose length follows the action's (so chunks differ from row to row); n turns."""

    def __init__(self, turns=4):
        self.turns = turns

    def reset(self):
        self.seen = 0
        return "start"

    def step(self, action):
        self.seen += 1
        return f"turn {self.seen} " + "ab " * (len(action) % 11), self.seen >= self.turns, {}

    def reward(self):
        return float(self.seen)

    def reward_parts(self):
        return {}


@pytest.fixture(scope="module")
def web_policy():
    if tiny_web_model() is None:
        pytest.skip("the tiny web model has not been built (scripts/build_tiny_web_model.py)")
    return load_policy(str(tiny_web_model()))


@pytest.fixture(scope="module")
def random_policy(tiny_model_path):
    """The random tiny Qwen2: its episodes diverge, its turns stop at different steps."""
    return load_policy(str(tiny_model_path))


@pytest.fixture(scope="module")
def sliding_policy(web_policy):
    """A random Gemma 3 with a 16-token sliding window on every other layer (mlx-lm's RotatingKVCache)."""
    mx.random.seed(0)
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=32,
        num_hidden_layers=3,
        intermediate_size=64,
        num_attention_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=1200,
        num_key_value_heads=1,
        sliding_window=16,
        sliding_window_pattern=2,
    )
    model = gemma3_text.Model(args)
    model.eval()
    return model, web_policy[1]


def _web_envs(rows=4, group=4):
    kinds = ("fact", "account", "fact", "shop")
    return [WebEnv(make_task(kinds[r % len(kinds)], 1, seed=r)) for r in range(rows) for _ in range(group)]


def _roll(policy, envs, group, reuse, temperature=1.0, max_tokens=12, max_turns=4, budget=600, **kw):
    model, tokenizer = policy
    return rollout_episodes(
        model,
        tokenizer,
        envs,
        group,
        SamplingConfig(temperature, max_tokens=max_tokens),
        max_turns,
        budget,
        "",
        seed=11,
        reuse_cache=reuse,
        **kw,
    )


def _worst_logprob_error(model, episodes, temperature=1.0):
    """Largest |recorded - full forward pass| over every model token of every episode."""
    worst = 0.0
    for ep in episodes:
        logp, _ = token_logprobs(model, mx.array([ep.prompt_tokens + ep.tokens]), temperature=temperature)
        forward = np.array(logp[0, len(ep.prompt_tokens) - 1 :])
        model_tokens = np.array(ep.mask) == 1
        worst = max(worst, float(np.abs(np.array(ep.logprobs)[model_tokens] - forward[model_tokens]).max()))
    return worst


def _same_episodes(a, b):
    assert [ep.tokens for ep in a] == [ep.tokens for ep in b]
    assert [ep.mask for ep in a] == [ep.mask for ep in b]
    assert [ep.finish_reason for ep in a] == [ep.finish_reason for ep in b]
    assert [ep.observations for ep in a] == [ep.observations for ep in b]


def _without_fixed_decode(monkeypatch):
    monkeypatch.setattr(fixed_decode, "supports_fixed_decode", lambda model, length=None: False)


def test_each_model_gets_the_player_its_cache_allows(web_policy, sliding_policy, monkeypatch):
    model, tokenizer = web_policy
    assert type(player_for(model, tokenizer, 2, 0, 8)) is FixedTurns
    assert type(player_for(model, tokenizer, 2, 0, 8, reuse_cache=False)) is Reprefill
    assert type(player_for(*sliding_policy, 2, 0, 8)) is GeneratorTurns
    _without_fixed_decode(monkeypatch)
    assert type(player_for(model, tokenizer, 2, 0, 8)) is GeneratorTurns
    # a cache mlx-lm cannot extend (here: quantized keys and values) falls back to prefilling again
    from mlx_lm.models.cache import QuantizedKVCache

    monkeypatch.setattr(turns, "make_prompt_cache", lambda model: [QuantizedKVCache()])
    assert type(player_for(model, tokenizer, 2, 0, 8)) is Reprefill


@pytest.mark.parametrize("path", ["fixed", "generator"])
def test_greedy_web_episodes_are_the_same_token_for_token_as_prefilling_again(web_policy, monkeypatch, path):
    if path == "generator":
        _without_fixed_decode(monkeypatch)
    again = _roll(web_policy, _web_envs(), 4, reuse=False, temperature=0.0)
    kept = _roll(web_policy, _web_envs(), 4, reuse=True, temperature=0.0)
    assert max(len(ep.turns) for ep in kept) >= 2  # there were later turns to get right
    _same_episodes(again, kept)
    for a, b in zip(again, kept):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


@pytest.mark.parametrize("path", ["fixed", "generator"])
def test_at_temperature_one_every_recorded_logprob_matches_a_full_forward_pass(web_policy, monkeypatch, path):
    if path == "generator":
        _without_fixed_decode(monkeypatch)
    episodes = _roll(web_policy, _web_envs(), 4, reuse=True)
    assert sum(len(ep.turns) >= 2 for ep in episodes) >= 4
    assert _worst_logprob_error(web_policy[0], episodes) < 1e-4


def test_diverging_episodes_of_a_random_model_narrowing_and_ragged_chunks(random_policy, monkeypatch):
    """Rows stop at many steps (the batch narrows mid-turn), chunks differ in length, episodes end at
    different turns: the kept buffers must still give exactly what prefilling again gives."""
    model, tokenizer = random_policy
    # One token in nine ends a turn, so turns stop at spread-out steps.
    monkeypatch.setattr(turns, "end_token_ids", lambda tokenizer: list(range(0, 260, 9)))
    monkeypatch.setattr("mlx_grpo.sampling.rollout.end_token_ids", lambda tokenizer: list(range(0, 260, 9)))
    envs = lambda: [VaryingEnv(turns=2 + i % 4) for i in range(12)]  # noqa: E731
    stats = Stats()
    kept = _roll(random_policy, envs(), 3, reuse=True, max_tokens=10, max_turns=5, stats=stats)
    again = _roll(random_policy, envs(), 3, reuse=False, max_tokens=10, max_turns=5)
    _same_episodes(again, kept)
    lengths = {len(t) for ep in kept for t in ep.turns}
    assert len(lengths) >= 4 and len({len(o) for ep in kept for o in ep.observations}) >= 3
    assert [t["rows"] for t in stats.turns] == sorted([t["rows"] for t in stats.turns], reverse=True)
    assert stats.turns[-1]["rows"] < 12  # finished episodes left the batch
    assert _worst_logprob_error(model, kept) < 1e-4


def test_a_sliding_window_model_keeps_its_caches_through_mlx_lms_generator(sliding_policy):
    envs = lambda: [VaryingEnv() for _ in range(6)]  # noqa: E731
    kept = _roll(sliding_policy, envs(), 3, reuse=True, max_tokens=9)
    again = _roll(sliding_policy, envs(), 3, reuse=False, max_tokens=9)
    _same_episodes(again, kept)
    assert min(len(ep.prompt_tokens) + len(ep.tokens) for ep in kept) > 40  # well past the 16-token window
    assert _worst_logprob_error(sliding_policy[0], kept) < 1e-4


def test_a_turn_prefills_only_what_is_new(web_policy):
    """Each group's first prompt once, then per episode and turn its new tokens (the last sampled token,
    the observation and the assistant header), less the one the decode feeds."""
    stats = Stats()
    kept = _roll(web_policy, _web_envs(), 4, reuse=True, stats=stats)
    expected = sum(len(ep.prompt_tokens) - 1 for ep in kept[::4])
    for ep in kept:
        mask = np.array(ep.mask)
        observation_runs = np.split(
            np.flatnonzero(mask == 0), np.flatnonzero(np.diff(np.flatnonzero(mask == 0)) > 1) + 1
        )
        expected += sum(len(run) for run in observation_runs if len(run))  # + the last token, - the fed one
    assert sum(t["prefilled"] for t in stats.turns) == expected


def test_prefilling_again_costs_more_with_every_turn(random_policy):
    kept, again = Stats(), Stats()
    for reuse, stats in ((True, kept), (False, again)):
        _roll(
            random_policy, [VaryingEnv(turns=5) for _ in range(4)], 2, reuse=reuse, max_turns=5, stats=stats
        )
    kept, again = [t["prefilled"] for t in kept.turns], [t["prefilled"] for t in again.turns]
    assert kept[0] == again[0] and len(kept) == 5
    assert all(b > 2 * a for a, b in zip(kept[2:], again[2:]))  # later turns: the conversation, not the news


def test_rows_of_finished_episodes_are_let_go(random_policy, monkeypatch):
    seen = []
    appended = turn_cache.appended

    def watched(pieces, ends, rows, chunks, max_tokens):
        buffers, start = appended(pieces, ends, rows, chunks, max_tokens)
        seen.append((len(rows), buffers.keys[0].shape[0]))
        return buffers, start

    monkeypatch.setattr(turn_cache, "appended", watched)
    _roll(
        random_policy,
        [VaryingEnv(turns=1 + i % 3) for i in range(6)],
        1,
        reuse=True,
        max_tokens=6,
        max_turns=3,
    )
    assert [s[0] for s in seen] == [4, 2] and all(live == held for live, held in seen)


def test_waves_by_memory_budget_give_the_same_episodes(random_policy):
    model, _ = random_policy
    per_row = kv_bytes_per_token(model) * fixed_decode.buffer_length(200)
    assert decode_width(model, 200, 256, budget=5 * per_row) == 5
    assert decode_width(model, 200, 3, budget=5 * per_row) == 3
    assert decode_width(model, 200, 256, budget=1) == 1
    envs = lambda: [VaryingEnv() for _ in range(8)]  # noqa: E731
    whole = _roll(random_policy, envs(), 2, reuse=True, budget=150, memory_budget=10**12)
    stats = Stats()
    narrow = _roll(
        random_policy,
        envs(),
        2,
        reuse=True,
        budget=150,
        stats=stats,
        memory_budget=3 * kv_bytes_per_token(model) * fixed_decode.buffer_length(150 + 20),
    )
    _same_episodes(whole, narrow)
    assert max(t["rows"] for t in stats.turns) == 2  # a width of 3 rounds down to whole groups of 2


def test_progress_reports_turns_episodes_and_tokens(random_policy):
    reports = []
    _roll(random_policy, [VaryingEnv(turns=2) for _ in range(4)], 2, reuse=True, on_progress=reports.append)
    assert [r["turn"] for r in reports] == [1, 1, 2, 2]
    assert [r["playing"] for r in reports] == [4, 4, 4, 0] and reports[-1]["finished"] == 4
    assert reports[-1]["tokens"] > 0 and reports[-1]["tokens_per_s"] > 0 and reports[-1]["episodes"] == 4


def test_the_multi_turn_bench_reports_both_modes_alike_where_they_must_agree(capsys, tmp_path):
    """scripts/bench_multiturn.py on the tiny web model, greedy: the two modes play the same episodes,
    "after" prefills at most the prompt and observation tokens, "before" more."""
    import importlib.util
    import json
    from pathlib import Path

    if tiny_web_model() is None:
        pytest.skip("the tiny web model has not been built (scripts/build_tiny_web_model.py)")
    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_multiturn.py"
    spec = importlib.util.spec_from_file_location("bench_multiturn", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(
        [
            "--model",
            str(tiny_web_model()),
            "--prompts",
            "2",
            "--samples",
            "2",
            "--temperature",
            "0",
            "--max-tokens",
            "8",
            "--max-turns",
            "4",
            "--out",
            str(tmp_path / "b.json"),
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads((tmp_path / "b.json").read_text())
    before, after = out["runs"]
    assert (before["mode"], after["mode"]) == ("before", "after") and "speedup" in out
    assert before["model_tokens"] == after["model_tokens"] and before["mean_reward"] == after["mean_reward"]
    assert before["prompt_and_observation_tokens"] == after["prompt_and_observation_tokens"]
    assert after["prefilled_over_new"] <= 1.1 < before["tokens_prefilled"] / after["tokens_prefilled"]
    assert [t["rows"] for t in after["turns"]] == [t["rows"] for t in before["turns"]]
    assert after["rollout_peak_over_kv"] > 0 and after["kv_bytes_per_token"] == before["kv_bytes_per_token"]
