"""Time the update's output head alone: log-probs and their gradient through a frozen head, two ways.

    python scripts/bench_head.py                              # Qwen2.5-0.5B's head (896 x 151936), 127 and 383 positions
    python scripts/bench_head.py --chunk 128 --json head.json # chunked, as the trainer chunks wide micro-batches

For each length: value and gradient (with respect to the hidden states) of the summed log-probs of
one row of random hidden states through a random frozen head, alternating

  autodiff       differentiating through the softmax (logprobs._project as a forward-only caller
                 would run it; chunked, under mx.checkpoint, which recomputes the head in the backward)
  frozen_head    the update's path (`differentiated=True`): d logp / d h worked out in the forward pass

--repeats times each after one warm-up, with MLX's peak memory above what was allocated before.
Prints one line a run and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import time

from mlx_grpo.blas import blas_description, use_openblas

use_openblas()

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

from mlx_grpo.update.logprobs import _project  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--lengths", type=int, nargs="+", default=[127, 383])
    parser.add_argument("--chunk", type=int, default=None, help="positions a chunk (default: none, as the trainer "
                        "runs one-row micro-batches of a 0.5B model on a CPU)")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    mx.random.seed(0)
    head = nn.Linear(args.hidden, args.vocab, bias=False)
    head.freeze()
    out = {"blas_kernels": blas_description(), "device": str(mx.default_device()), "workload": vars(args), "runs": []}
    for length in args.lengths:
        hidden = mx.random.normal((1, length, args.hidden)) * 0.05
        targets = mx.random.randint(0, args.vocab, (1, length))
        mx.eval(head.parameters(), hidden, targets)
        for _ in range(args.repeats):
            for frozen in (False, True):
                def summed(h, frozen=frozen):
                    logp, entropy = _project((head, head), h, targets, args.temperature, args.chunk,
                                             differentiated=frozen)
                    return logp.sum(), entropy

                mx.eval(mx.value_and_grad(summed)(hidden))  # warm-up
                mx.reset_peak_memory()
                before = mx.get_active_memory()
                start = time.perf_counter()
                mx.eval(mx.value_and_grad(summed)(hidden))
                row = {"positions": length, "path": "frozen_head" if frozen else "autodiff",
                       "seconds": time.perf_counter() - start,
                       "peak_above_mib": (mx.get_peak_memory() - before) / 2**20}
                out["runs"].append(row)
                print(row, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
