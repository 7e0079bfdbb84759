"""Decoding throughput of multi-turn tool episodes against single-turn completions at the same shape.

    python scripts/bench_tool_turns.py --model smollm2-135m --prompts 4 --samples 8 --max-tokens 64 \\
        --max-turns 4 --repeat 2 --json tool-turns.json
    python scripts/bench_tool_turns.py --model rewards/multihop/assets/tiny-tools   # the tiny tool model

Multi-turn: `rollout_episodes` plays P x G episodes of the multihop task
(synthetic 2-hop rows of the test split, MultihopEnv with the task's rewards and
system prompt), max_tokens T a turn, at most K turns. Every turn of the
episodes still playing decodes as one batch; between turns the tool results
are prefilled. Counted: the model's own tokens (mask 1), the tokens prefilled
(first prompts and observations), the turns played, and where the seconds go
(prefill and decode from the rollout's own per-turn Stats, the environments'
steps timed around multiturn._step_envs, the rest: tokenizing the joins,
rewards, bookkeeping). SmolLM2-135M-Instruct answers the multihop questions
without calling a tool, so its episodes end after one turn; with
--force-calls, a turn before the last that holds no call is stepped as a
search for the question (the call written in the episode's tool-call style),
so that every episode plays --max-turns turns: the model's tokens are still
its own, only which tool result follows is scripted.

Single-turn at the same shape: `sample_completions` on the same first prompts
(each episode's rendered first prompt, P prompts x G), max_tokens = the mean
model tokens of an episode of the multi-turn run, without stopping on the end
token (--stop-on-eos to stop), so both decode the same rows and about the same
model tokens.

`--repeat` rounds run in this one process, interleaved (multi then single,
then single then multi, ...), both with the same seed, so that they see the
same machine load; the first round includes compiling the decode steps. The
summary compares the fastest round of each. A table goes to stderr, one JSON
object to stdout (and to --json).
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
from benchlib import Timer, emit_result, load_average, machine, markdown_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY_TOOLS = ROOT / "rewards" / "multihop" / "assets" / "tiny-tools"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help=f"model (as for train --model, or a folder such as {TINY_TOOLS.relative_to(ROOT)})",
    )
    p.add_argument("--prompts", type=int, default=4, help="multihop questions (P)")
    p.add_argument("--samples", type=int, default=8, help="episodes (completions) per question (G)")
    p.add_argument("--max-tokens", type=int, default=64, help="model tokens a turn (T)")
    p.add_argument("--max-turns", type=int, default=4, help="model turns an episode at most (K)")
    p.add_argument(
        "--max-episode-tokens", type=int, default=1536, help="tokens an episode after its first prompt"
    )
    p.add_argument("--hops", type=int, default=2, help="hops of the synthetic questions")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=256, help="decode_concurrency (rows decoded at once)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-on-eos", action="store_true", help="single-turn rows stop at the end token")
    p.add_argument(
        "--force-calls",
        action="store_true",
        help="a turn before the last without a tool call is stepped as search(question)",
    )
    p.add_argument("--repeat", type=int, default=1, help="rounds of both, interleaved")
    p.add_argument("--json", help="write the JSON here too")
    return p.parse_args(argv)


class _NoEnd:
    """The tokenizer as sample_completions reads it, with no end token: every row decodes max_tokens."""

    eos_token_ids = ()
    eos_token_id = None

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


@contextmanager
def _timed_steps(seconds: list[float]):
    """Each turn's wall seconds stepping the environments (their tool calls), appended to `seconds`."""
    from mlx_grpo.sampling import multiturn

    real = multiturn._step_envs

    def timed(envs, moves):
        with Timer() as timer:
            try:
                return real(envs, moves)
            finally:
                seconds.append(timer.seconds)

    multiturn._step_envs = timed
    try:
        yield
    finally:
        multiturn._step_envs = real


def _call_text(style: str, name: str, arguments: dict) -> str:
    """A call as a model writes it in `style` (mlx_grpo/tools/calls.py reads each)."""
    body = {"name": name, ("parameters" if style == "llama3" else "arguments"): arguments}
    if style == "hermes":
        return f"<tool_call>{json.dumps(body)}</tool_call>"
    return json.dumps(body) if style == "llama3" else f"[TOOL_CALLS][{json.dumps(body)}]"


def _envs(args):
    """P x G multihop episodes (the task's rewards and system prompt), and that system prompt."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # rewards/ is a folder of the repository, not of the package
    from mlx_grpo.tools.calls import parse_calls
    from rewards.multihop.training import REWARDS, SYSTEM_PROMPT, MultihopEnv, synthetic_rows

    class BenchEnv(MultihopEnv):
        """MultihopEnv; with --force-calls, a turn without a call (but the last) is stepped as a search."""

        def reset(self):
            self.turns_stepped, self.forced = 0, 0
            return super().reset()

        def step(self, action: str):
            self.turns_stepped += 1
            if (
                args.force_calls
                and self.turns_stepped < args.max_turns
                and not parse_calls(action, self.style)
            ):
                call = _call_text(self.style, "search", {"query": self.row["question"]})
                if parse_calls(call, self.style):
                    self.forced += 1
                    action = call
            return super().step(action)

    rows = synthetic_rows("test", [args.hops], args.prompts, seed=0)
    functions, weights = [f for f, _ in REWARDS], [w for _, w in REWARDS]
    return [
        BenchEnv(row, functions, weights, SYSTEM_PROMPT, 5.0) for row in rows for _ in range(args.samples)
    ], SYSTEM_PROMPT


def multi_turn(model, tokenizer, args) -> tuple[dict, list[list[int]]]:
    """One multi-turn rollout: totals, per-turn costs, and the groups' first prompts."""
    from mlx_grpo.sampling.multiturn import rollout_episodes
    from mlx_grpo.sampling.rollout import SamplingConfig
    from mlx_grpo.sampling.turns import Stats

    envs, system_prompt = _envs(args)
    stats, steps = Stats(), []
    load = load_average()[0]
    with Timer() as timer, _timed_steps(steps):
        episodes = rollout_episodes(
            model,
            tokenizer,
            envs,
            args.samples,
            SamplingConfig(args.temperature, max_tokens=args.max_tokens),
            args.max_turns,
            args.max_episode_tokens,
            system_prompt,
            args.concurrency,
            seed=args.seed,
            stats=stats,
        )
    seconds = timer.seconds
    model_tokens = sum(int(sum(ep.mask)) for ep in episodes)
    prompts = sum(len(ep.prompt_tokens) for ep in episodes[:: args.samples])
    observations = sum(len(ep.mask) - int(sum(ep.mask)) for ep in episodes)
    prefill_s = sum(t["prefill_s"] for t in stats.turns)
    decode_s = sum(t["decode_s"] for t in stats.turns)
    reasons = [ep.finish_reason for ep in episodes]
    turns = [
        {
            "turn": t["turn"],
            "rows": t["rows"],
            "longest": t["longest"],
            "prefilled": t["prefilled"],
            "generated": t["generated"],
            "prefill_s": round(t["prefill_s"], 3),
            "decode_s": round(t["decode_s"], 3),
            "env_step_s": round(s, 3),
        }
        for t, s in zip(stats.turns, steps)
    ]
    result = {
        "mode": "multi",
        "rows": len(episodes),
        "seconds": round(seconds, 3),
        "model_tokens": model_tokens,
        "tokens_per_s": round(model_tokens / seconds, 2),
        "decode_tokens_per_s": round(model_tokens / decode_s, 2) if decode_s > 0 else None,
        "model_tokens_per_row": round(model_tokens / len(episodes), 2),
        "tokens_prefilled": sum(t["prefilled"] for t in stats.turns),
        "prompt_and_observation_tokens": prompts + observations,
        "observation_tokens": observations,
        "turns_played": sum(len(ep.turns) for ep in episodes),
        "batched_turns": len(stats.turns),
        "mean_turns": round(sum(len(ep.turns) for ep in episodes) / len(episodes), 3),
        "prefill_s": round(prefill_s, 3),
        "decode_s": round(decode_s, 3),
        "env_step_s": round(sum(steps), 3),
        "other_s": round(seconds - prefill_s - decode_s - sum(steps), 3),
        "finish": {r: reasons.count(r) for r in dict.fromkeys(reasons)},
        "tool_calls": sum(ep.info.get("tools/calls", 0) for ep in episodes),
        "forced_calls": sum(env.forced for env in envs),
        "mean_reward": round(sum(ep.reward for ep in episodes) / len(episodes), 4),
        "load_before": round(load, 2),
        "turns": turns,
    }
    return result, [ep.prompt_tokens for ep in episodes[:: args.samples]]


def single_turn(model, tokenizer, prompts: list[list[int]], max_tokens: int, args) -> dict:
    """sample_completions on the first prompts, P x G rows of max_tokens (no end token unless
    --stop-on-eos)."""
    from mlx_grpo.sampling import fixed_decode
    from mlx_grpo.sampling.rollout import SamplingConfig, sample_completions

    meter = fixed_decode.PREFILL
    prefilled, prefill_s = meter.tokens, meter.seconds
    load = load_average()[0]
    with Timer() as timer:
        outs = sample_completions(
            model,
            tokenizer if args.stop_on_eos else _NoEnd(tokenizer),
            prompts,
            args.samples,
            SamplingConfig(args.temperature, max_tokens=max_tokens),
            args.concurrency,
            seed=args.seed,
        )
    seconds = timer.seconds
    prefill_s = meter.seconds - prefill_s
    model_tokens = sum(len(c.tokens) for c in outs)
    return {
        "mode": "single",
        "rows": len(outs),
        "seconds": round(seconds, 3),
        "max_tokens": max_tokens,
        "model_tokens": model_tokens,
        "tokens_per_s": round(model_tokens / seconds, 2),
        "decode_tokens_per_s": round(model_tokens / (seconds - prefill_s), 2)
        if seconds > prefill_s
        else None,
        "model_tokens_per_row": round(model_tokens / len(outs), 2),
        "tokens_prefilled": meter.tokens - prefilled,
        "prompt_tokens": sum(len(p) for p in prompts),
        "prefill_s": round(prefill_s, 3),
        "decode_s": round(seconds - prefill_s, 3),
        "stopped": sum(c.finish_reason == "stop" for c in outs),
        "load_before": round(load, 2),
    }


def bench(args) -> dict:
    """Load the model once, then `repeat` interleaved rounds of both modes; the summary compares the best."""
    import mlx.core as mx

    from mlx_grpo.blas import loaded_blas
    from mlx_grpo.models.loading import load_policy

    model_name = (
        str(TINY_TOOLS) if args.model in ("tiny-tools", "tiny_tools") and TINY_TOOLS.exists() else args.model
    )
    load_start = load_average()
    model, tokenizer = load_policy(model_name)
    model.eval()
    mx.eval(model.parameters())
    runs, prompts, max_tokens = [], None, None
    for round_ in range(args.repeat):
        order = ("multi", "single") if round_ % 2 == 0 or prompts is None else ("single", "multi")
        for mode in order:
            if mode == "multi":
                result, prompts = multi_turn(model, tokenizer, args)
                if max_tokens is None:  # the first round's mean episode: the same work in every round
                    max_tokens = max(1, round(result["model_tokens_per_row"]))
            else:
                result = single_turn(model, tokenizer, prompts, max_tokens, args)
            result["round"] = round_
            runs.append(result)
            print(line(result), file=sys.stderr, flush=True)
    best = {
        m: min((r for r in runs if r["mode"] == m), key=lambda r: r["seconds"]) for m in ("multi", "single")
    }
    multi, single = best["multi"], best["single"]
    summary = {
        "rows": multi["rows"],
        "multi_tokens_per_s": multi["tokens_per_s"],
        "single_tokens_per_s": single["tokens_per_s"],
        "multi_seconds": multi["seconds"],
        "single_seconds": single["seconds"],
        "multi_model_tokens": multi["model_tokens"],
        "single_model_tokens": single["model_tokens"],
        # > 1: single-turn decodes that many times more model tokens a second than multi-turn.
        "single_over_multi_tokens_per_s": round(single["tokens_per_s"] / multi["tokens_per_s"], 3),
        "multi_decode_tokens_per_s": multi["decode_tokens_per_s"],
        "single_decode_tokens_per_s": single["decode_tokens_per_s"],
        "multi_time_split": {
            k: round(multi[k] / multi["seconds"], 3)
            for k in ("prefill_s", "decode_s", "env_step_s", "other_s")
        },
    }
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "json"} | {"model": model_name},
        "machine": {**machine(), "blas": loaded_blas(), "device": str(mx.default_device())},
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "summary": summary,
        "runs": runs,
    }


def line(r: dict) -> str:
    extra = (
        f"{r['turns_played']} turns in {r['batched_turns']} batches, {r['tool_calls']} tool calls "
        f"({r['forced_calls']} forced), prefill {r['prefill_s']} s, decode "
        f"{r['decode_s']} s, tools {r['env_step_s']} s, other {r['other_s']} s"
        if r["mode"] == "multi"
        else f"max_tokens {r['max_tokens']}, prefill {r['prefill_s']} s, decode {r['decode_s']} s"
    )
    return (
        f"round {r['round']} {r['mode']}: {r['rows']} rows, "
        f"{r['model_tokens']} model tokens in {r['seconds']} s "
        f"= {r['tokens_per_s']} tok/s ({extra}; load {r['load_before']})"
    )


def table(out: dict) -> str:
    s = out["summary"]
    multi = min((r for r in out["runs"] if r["mode"] == "multi"), key=lambda r: r["seconds"])
    single = min((r for r in out["runs"] if r["mode"] == "single"), key=lambda r: r["seconds"])
    lines = [
        markdown_table(
            [
                "",
                "rows",
                "model tokens",
                "prefilled",
                "seconds",
                "prefill s",
                "decode s",
                "tools s",
                "other s",
                "tokens/s",
            ],
            [
                [
                    name,
                    r["rows"],
                    r["model_tokens"],
                    r["tokens_prefilled"],
                    r["seconds"],
                    r["prefill_s"],
                    r["decode_s"],
                    r.get("env_step_s", "-"),
                    r.get("other_s", "-"),
                    r["tokens_per_s"],
                ]
                for name, r in (("multi-turn", multi), ("single-turn", single))
            ],
        )
    ]
    lines.append(
        f"single / multi tokens/s: {s['single_over_multi_tokens_per_s']}x; load average "
        f"{out['load_average_start']} -> {out['load_average_end']}; blas {out['machine']['blas']}"
    )
    columns = ["turn", "rows", "longest", "prefilled", "generated", "prefill_s", "decode_s", "env_step_s"]
    lines.append(
        markdown_table(
            ["turn", "rows", "longest", "prefilled", "generated", "prefill s", "decode s", "tools s"],
            [[t[c] for c in columns] for t in multi["turns"]],
        )
    )
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if argv is None:
        from mlx_grpo.blas import use_openblas

        use_openblas()  # re-executes this script with OpenBLAS preloaded, when there is one
    out = bench(args)
    emit_result(out, args.json, table(out))
    return out


if __name__ == "__main__":
    main()
