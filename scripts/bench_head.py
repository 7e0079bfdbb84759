"""Head A/B at the trainer's 0.5B shapes: value_and_grad of the log-probs through a frozen 896x151936 head,
unchunked (as the trainer runs it at 1-row micro-batches), the checkpoint/autodiff path vs the frozen-head path."""
import json, sys, time
from mlx_grpo.blas import blas_description, use_openblas
use_openblas()
import mlx.core as mx, mlx.nn as nn
from mlx_grpo.update.logprobs import _project
mx.random.seed(0)
head = nn.Linear(896, 151936, bias=False); head.freeze()
out = {"blas": blas_description(), "runs": []}
for length in (127, 383):
    h = mx.random.normal((1, length, 896)) * 0.05
    t = mx.random.randint(0, 151936, (1, length))
    mx.eval(head.parameters(), h, t)
    for rep in range(4):
        for diff in (False, True):
            def f(h):
                logp, ent = _project((head, head), h, t, 0.8, None, differentiated=diff)
                return logp.sum(), ent
            mx.eval(mx.value_and_grad(f)(h))  # warm
            mx.reset_peak_memory(); base = mx.get_active_memory()
            t0 = time.perf_counter(); mx.eval(mx.value_and_grad(f)(h)); dt = time.perf_counter() - t0
            row = {"positions": length, "frozen_head_path": diff, "seconds": dt,
                   "peak_above_mib": (mx.get_peak_memory() - base) / 2**20}
            out["runs"].append(row); print(row, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
