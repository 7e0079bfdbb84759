"""Do mlx-grpo's and mlx-lm-lora's samplers draw completions of the same length from the same model?

    python scripts/sampler_lengths.py --model PATH --samples 64 --max-tokens 64

Both samplers get the same model (no adapters), prompts (bench.py's, in the
chat template), temperature and max_tokens; each draws `--samples`
completions per prompt, the peer through its own trainer's generate_grpo
(decode width = number of prompts, as in its train_grpo). Printed as JSON, per
sampler: the stop tokens it uses, mean length, the share that stopped on an
end token, and the mean log-prob per token of its completions re-scored by a
plain forward pass of the model (two samplers of the same distribution agree
on it within noise); then a permutation test of the two mean lengths.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import prompt_texts  # noqa: E402

from mlx_grpo.blas import use_openblas  # noqa: E402
from mlx_grpo.models.loading import load_policy  # noqa: E402
from mlx_grpo.sampling.rollout import SamplingConfig, end_token_ids, sample_completions  # noqa: E402
from mlx_grpo.tasks.data import encode_prompt  # noqa: E402
from mlx_grpo.update.logprobs import token_logprobs  # noqa: E402


def rescored_logprob(model, prompt: list[int], completion: list[int]) -> float:
    """Mean log-prob per completion token under one plain forward pass (temperature 1)."""
    logp, _ = token_logprobs(model, mx.array([prompt + completion]))
    return float(logp[0, len(prompt) - 1:].mean().item())


def summary(model, prompts, rows, max_tokens, stop_ids) -> dict:
    """rows: (prompt index, completion ids) pairs."""
    lengths = np.array([len(ids) for _, ids in rows])
    stopped = np.array([bool(ids) and ids[-1] in stop_ids for _, ids in rows])
    per_prompt = [float(np.mean([len(ids) for i, ids in rows if i == p])) for p in range(len(prompts))]
    scores = [rescored_logprob(model, prompts[i], ids) for i, ids in rows if ids]
    return {"stop_token_ids": sorted(stop_ids), "mean_length": float(lengths.mean()),
            "mean_length_per_prompt": per_prompt, "stopped_frac": float(stopped.mean()),
            "hit_max_tokens_frac": float(np.mean(lengths >= max_tokens)),
            "rescored_logprob_per_token": float(np.mean(scores)), "lengths": lengths.tolist()}


def permutation_p(a, b, resamples=20_000, seed=0) -> float:
    """Two-sided p-value of the difference of means under random relabelling."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    both, observed = np.concatenate([a, b]), abs(a.mean() - b.mean())
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(resamples):
        rng.shuffle(both)
        hits += abs(both[:len(a)].mean() - both[len(a):].mean()) >= observed
    return (hits + 1) / (resamples + 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--samples", type=int, default=64, help="completions per prompt and sampler")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if argv is None:
        use_openblas()  # as the mlx-grpo command and bench.py do

    from mlx_lm_lora.trainer.grpo_trainer import generate_grpo

    model, tokenizer = load_policy(args.model)
    model.eval()
    prompts = [encode_prompt(tokenizer, t) for t in prompt_texts(args.prompts)]
    ours = sample_completions(model, tokenizer, prompts, args.samples,
                              SamplingConfig(temperature=args.temperature, max_tokens=args.max_tokens),
                              seed=args.seed)
    mx.random.seed(args.seed)
    theirs, _, indices = generate_grpo(model, tokenizer, prompts, args.max_tokens, args.samples, len(prompts),
                                       end_token="", temperature=args.temperature, top_p=1.0, top_k=0, min_p=0.0)
    out = {
        "model": args.model, "samples_per_prompt": args.samples, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "prompt_tokens": [len(q) for q in prompts],
        "mlx_grpo": summary(model, prompts, [(c.prompt_index, c.tokens) for c in ours], args.max_tokens,
                            set(end_token_ids(tokenizer))),
        "mlx_lm_lora": summary(model, prompts, [(i, c.tolist()) for i, c in zip(indices, theirs)], args.max_tokens,
                               set(tokenizer.eos_token_ids)),
    }
    out["mean_length_p_value"] = permutation_p(out["mlx_grpo"]["lengths"], out["mlx_lm_lora"]["lengths"])
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
