"""Time a multi-turn rollout of the web task, turn by turn, before and after keeping the caches.

    python scripts/bench_multiturn.py --model smollm2-135m --prompts 4 --samples 8
    python scripts/bench_multiturn.py --mode after --prompts 36 --samples 8     # one mode only

"before" prefills every conversation again each turn (rollout_episodes with
reuse_cache=False, the way it was); "after" keeps each episode's keys and
values between turns. Each mode runs in a process of its own (so each reports
its own max RSS), in the order given, `--repeat` times interleaved so that both
see the same machine load. For each turn: rows (episodes still playing), the
longest context, tokens prefilled, prefill and decode seconds, and the peak
MLX memory above what the process held before the rollout, next to the
keys and values the turn's rows need (rows x (longest context + max_tokens)).
Totals: the rollout's seconds, tokens prefilled against the prompt and
observation tokens (each group's first prompt once), the rollout's peak
against the largest key/value need of any turn, and the load average.
stdout is one JSON object; the tables go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
from benchlib import Timer, emit_result, load_average, markdown_table  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", default="smollm2-135m", help="model (as for train --model); default smollm2-135m"
    )
    p.add_argument("--prompts", type=int, default=4, help="web tasks (held-out rows)")
    p.add_argument("--samples", type=int, default=8, help="episodes per task (the group)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-episode-tokens", type=int, default=1536)
    p.add_argument(
        "--concurrency", type=int, default=256, help="decode_concurrency (the budget may lower it)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", nargs="+", default=["before", "after"], choices=("before", "after"))
    p.add_argument("--repeat", type=int, default=1, help="runs of each mode, interleaved")
    p.add_argument("--out", help="write the JSON here too")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run_mode(args, mode: str) -> dict:
    """One rollout in this process: per-turn costs and totals."""
    from dataclasses import replace

    import mlx.core as mx

    from mlx_grpo.blas import blas_description, loaded_blas
    from mlx_grpo.config import build_config
    from mlx_grpo.models.loading import load_policy
    from mlx_grpo.sampling.multiturn import make_envs, rollout_episodes
    from mlx_grpo.sampling.turns import Stats
    from mlx_grpo.sampling.width import kv_bytes_per_token
    from mlx_grpo.run.task_setup import load_task
    from mlx_grpo.tasks.registry import recommended_settings

    config = build_config(
        {
            "task": "web",
            "model": args.model,
            "eval_num_problems": args.prompts,
            "max_tokens": args.max_tokens,
            "max_turns": args.max_turns,
            "max_episode_tokens": args.max_episode_tokens,
        },
        task_defaults=recommended_settings,
    )
    task = load_task(config)
    model, tokenizer = load_policy(config.model)
    model.eval()
    rows = task.eval_rows[: args.prompts]
    per_token = kv_bytes_per_token(model)
    mx.random.seed(args.seed)
    mx.eval(model.parameters())
    mx.clear_cache()
    before = mx.get_active_memory()
    stats = Stats()
    with Timer() as timer:
        episodes = rollout_episodes(
            model,
            tokenizer,
            make_envs(task, rows, args.samples),
            args.samples,
            replace(config.sampling, temperature=args.temperature, max_tokens=args.max_tokens),
            args.max_turns,
            args.max_episode_tokens,
            task.system_prompt,
            args.concurrency,
            seed=args.seed,
            reuse_cache=mode == "after",
            stats=stats,
        )
    seconds = timer.seconds
    turns = []
    for t in stats.turns:
        needed = t["rows"] * (t["longest"] + args.max_tokens) * per_token
        above = t["peak_gb"] * 1e9 - before
        turns.append(
            {
                **{k: round(v, 3) if isinstance(v, float) else v for k, v in t.items()},
                "kv_needed_gb": round(needed / 1e9, 3),
                "peak_above_start_gb": round(above / 1e9, 3),
                "peak_over_kv": round(above / needed, 2),
            }
        )
    prompts = sum(len(ep.prompt_tokens) for ep in episodes[:: args.samples])
    observations = sum(len(ep.mask) - int(sum(ep.mask)) for ep in episodes)
    prefilled = sum(t["prefilled"] for t in stats.turns)
    rewards = [ep.reward for ep in episodes]
    return {
        "mode": mode,
        "model": config.model,
        "blas": loaded_blas(),
        "blas_kernels": blas_description(),
        "rows": len(episodes),
        "rollout_s": round(seconds, 2),
        "prefill_s": round(sum(t["prefill_s"] for t in stats.turns), 2),
        "decode_s": round(sum(t["decode_s"] for t in stats.turns), 2),
        "tokens_prefilled": prefilled,
        "prompt_and_observation_tokens": prompts + observations,
        "prefilled_over_new": round(prefilled / max(1, prompts + observations), 3),
        "model_tokens": sum(int(sum(ep.mask)) for ep in episodes),
        "kv_bytes_per_token": per_token,
        "weights_and_start_gb": round(before / 1e9, 3),
        "max_peak_over_kv": max(t["peak_over_kv"] for t in turns),
        # The whole rollout: its highest peak against the most keys and values any turn's rows need.
        "rollout_peak_over_kv": round(
            max(t["peak_above_start_gb"] for t in turns) / max(t["kv_needed_gb"] for t in turns), 2
        ),
        "mean_reward": round(sum(rewards) / len(rewards), 4),
        "max_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3),
        "turns": turns,
    }


def table(result: dict) -> str:
    cols = (
        "turn",
        "rows",
        "longest",
        "prefilled",
        "prefill_s",
        "decode_s",
        "peak_gb",
        "kv_needed_gb",
        "peak_over_kv",
    )
    lines = [
        f"{result['mode']}: {result['rollout_s']} s "
        f"(prefill {result['prefill_s']}, decode {result['decode_s']}), "
        f"prefilled {result['tokens_prefilled']} = {result['prefilled_over_new']}x "
        "the prompt and observation "
        f"tokens, peak {result['rollout_peak_over_kv']}x the most keys and values a turn needs, "
        f"max RSS {result['max_rss_gb']} GB, blas {result['blas']}",
        markdown_table(list(cols), [[t[c] for c in cols] for t in result["turns"]]),
    ]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    from mlx_grpo.blas import use_openblas
    from mlx_grpo.models.heap import keep_freed_memory

    if argv is None:
        use_openblas()  # re-executes this script with OpenBLAS preloaded, when there is one (each child too)
        keep_freed_memory()  # as the mlx-grpo command does (models/heap.py)
    if args.child:
        print(json.dumps(run_mode(args, args.mode[0])))
        return
    results = []
    base = [a for a in (argv if argv is not None else sys.argv[1:])]
    for _ in range(args.repeat):
        for mode in args.mode:
            child = [sys.executable, __file__, *base, "--child", "--mode", mode]
            done = subprocess.run(child, stdout=subprocess.PIPE, text=True, check=True, env=dict(os.environ))
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(result)
            print(table(result), file=sys.stderr, flush=True)
    out = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "out")},
        "load_average": load_average(),
        "runs": results,
    }
    by_mode = {m: [r["rollout_s"] for r in results if r["mode"] == m] for m in args.mode}
    if all(by_mode.get(m) for m in ("before", "after")):
        out["speedup"] = round(min(by_mode["before"]) / min(by_mode["after"]), 2)
        print(f"speedup (best before / best after): {out['speedup']}x", file=sys.stderr)
    emit_result(out, args.out)


if __name__ == "__main__":
    main()
