"""One update on chosen completions, and what it does to the answer's first token.

Takes a recipe's model and task, puts either the first --rows train rows' reference
answers (--guide's) or the model's own right answers to them (--own: sampled 8 at the
recipe's temperature, the first right one that ended) in groups of one at advantage 1,
and takes one update per optimizer spec from the same starting adapters. Before and after
each it prints, as JSON lines: the first-token probabilities of "####", "To", "Let" and
"First" on the first 6 held-out prompts, and the trained completions' mean and first-token
log-probs. It first checks that the update's log-probs of each trained completion equal its
behaviour log-probs (the ratio is 1 in the update, as for a sampled answer).

It is how docs/real-models.md separated a silent wrong in the update from what the
references teach ("Why one guided GSM8K step ..."):

    python scripts/one_update_probe.py --model Q4_K_M.gguf --data DIR adam:1e-5 sgd:0.03
    python scripts/one_update_probe.py --model Q4_K_M.gguf --data DIR --own adam:1e-5
    python scripts/one_update_probe.py --model Q4_K_M.gguf --data DIR --shaping 0.1 adam:1e-5
"""

from __future__ import annotations

import argparse
import json
import time

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_map

from mlx_grpo import make_config
from mlx_grpo.api import sample_group, score_group
from mlx_grpo.blas import use_openblas
from mlx_grpo.run.guidance import reference_completion
from mlx_grpo.run.setup import setup
from mlx_grpo.run.step_update import update_settings
from mlx_grpo.tasks.accuracy import accuracy_values, right
from mlx_grpo.tasks.data import task_prompts
from mlx_grpo.update.batch import batch_shape, build_batch, micro_batches
from mlx_grpo.update.logprobs import completion_logprobs, token_logprobs
from mlx_grpo.update.step import update

from first_tokens import first_token_probs  # scripts/ is on the path when a script runs

WATCHED = ["####", "To", "Let", "First"]


def own_right_answers(model, tokenizer, task, temperature: float, max_tokens: int, count: int):
    """(rows, completions): the first `count` train rows of which 8 samples hold a right answer that ended."""
    rows, answers = [], []
    for row in task.train_rows:
        group = sample_group(model, tokenizer, row["prompt"], 8, temperature=temperature, max_tokens=max_tokens,
                             system_prompt=task.system_prompt, seed=1)
        is_right = right(accuracy_values(task, [row], len(group), group, score_group(task, row, group)))
        ended = [c for c, ok in zip(group, is_right) if ok and c.finish_reason == "stop"]
        if ended:
            rows.append(row)
            answers.append(ended[0])
        if len(answers) == count:
            return rows, answers
    raise SystemExit(f"only {len(answers)} train rows with a right sampled answer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("updates", nargs="+", help="optimizer:lr, each from the same start (adam:1e-5, sgd:0.03)")
    parser.add_argument("--config", default="configs/gsm8k_qwen05.yaml")
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", default=None)
    parser.add_argument("--rows", type=int, default=4, help="train rows whose answers are trained")
    parser.add_argument("--own", action="store_true", help="the model's own right answers instead of the references")
    parser.add_argument("--shaping", type=float, default=0.0, help="guide_shaping of the references' tokens")
    args = parser.parse_args()
    use_openblas()

    started = time.perf_counter()
    config = make_config(args.config, model=args.model, data=args.data, guide=True, guide_shaping=args.shaping,
                         steps=1, eval_num_problems=6)
    run = setup(config)
    model, tokenizer, task, temperature = run.model, run.tokenizer, run.task, config.temperature
    if args.own:
        rows, trained = own_right_answers(model, tokenizer, task, temperature, config.max_tokens, args.rows)
    else:
        rows = task.train_rows[:args.rows]
        trained = [reference_completion(model, tokenizer, task, p, task.reference_answer(r), i, temperature)
                   for i, (r, p) in enumerate(zip(rows, task_prompts(tokenizer, task, rows)))]
    print(json.dumps({"seconds": round(time.perf_counter() - started), "trained_start": [
        tokenizer.decode(c.tokens[:4]) for c in trained]}), flush=True)
    watched = {w: tokenizer.encode(w, add_special_tokens=False)[0] for w in WATCHED}
    held_out = task_prompts(tokenizer, task, task.eval_rows[:6])

    batch = build_batch(trained, np.ones(len(trained)), 1)
    parts = micro_batches(batch, 1)
    for mb, c in zip(parts, trained):
        logp, _ = completion_logprobs(model, mb.prompts, mb.left_padding, mb.completions, 1, temperature)
        gap = float(np.abs(np.array(logp[0]) - np.array(c.logprobs)).max())
        print(json.dumps({"update_vs_behaviour_max_abs": gap, "tokens": len(c.tokens)}), flush=True)

    def report(label: str) -> None:
        model.eval()
        probs = [first_token_probs(model, p) for p in held_out]
        logps = [token_logprobs(model, mx.array([c.prompt_tokens + c.tokens]), temperature)[0][0, len(c.prompt_tokens) - 1:]
                 for c in trained]
        model.train()
        print(json.dumps({"label": label,
                          "held_out_first": {w: [round(p[i].item(), 3) for p in probs] for w, i in watched.items()},
                          "trained_mean_logprob": [round(lp.mean().item(), 3) for lp in logps],
                          "trained_first_logprob": [round(lp[0].item(), 3) for lp in logps]}), flush=True)

    start = tree_map(lambda x: x, model.trainable_parameters())
    report("start")
    sizes = batch_shape(batch, 1, config.max_tokens)
    for spec in args.updates:
        kind, lr = spec.split(":")
        optimizer = optim.SGD(learning_rate=float(lr)) if kind == "sgd" else optim.AdamW(learning_rate=float(lr),
                                                                                        weight_decay=0.0)
        model.update(tree_map(lambda x: x, start))
        metrics = update(model, optimizer, update_settings(config), sizes, parts, None, None)
        print(json.dumps({"update": spec, **{k: metrics[k] for k in ("grad_norm", "ratio/mean", "update/rel_change")}}),
              flush=True)
        report(spec)


if __name__ == "__main__":
    main()
