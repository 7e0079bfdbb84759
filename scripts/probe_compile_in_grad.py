"""Does `mx.compile` still fuse when its function runs inside `mx.value_and_grad`? Prints JSON.

The update's loss is traced by value_and_grad, and everything it calls runs there: the compiled
SwiGLU and polynomial exp of models/cpu_math.py, and the frozen head's softmax. This times, at one
update piece's head shape (1 x 127 x 151,936 float32), an elementwise chain of 16 ops and the exps,
eagerly and compiled, on their own and inside value_and_grad (input behind stop_gradient, as in the
frozen-head path, and differentiated). Medians of 5, after a warm-up; peak above the inputs in MiB.

    python scripts/probe_compile_in_grad.py [--positions 127]
"""

from __future__ import annotations

import argparse
import json
import time

from mlx_grpo.blas import blas_description, use_openblas


def main() -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--positions", type=int, default=127)
    p.add_argument("--vocab", type=int, default=151936)
    args = p.parse_args()
    use_openblas()  # re-executes with OpenBLAS preloaded, as the mlx-grpo command does
    import mlx.core as mx

    from mlx_grpo.models import cpu_math, heap

    heap.keep_freed_memory()  # as the trainer runs: freed blocks stay, no fresh page faults per op
    z = mx.random.normal((1, args.positions, args.vocab)) * 3 - 5
    mx.eval(z)

    def chain(x):
        for _ in range(8):
            x = x * 1.0001 + 0.001
        return x

    def timed(make, repeats=5):
        mx.eval(make())
        seconds = []
        for _ in range(repeats):
            mx.reset_peak_memory()
            before = mx.get_active_memory()
            start = time.perf_counter()
            mx.eval(make())
            seconds.append(time.perf_counter() - start)
        return {"ms": round(sorted(seconds)[repeats // 2] * 1000, 1),
                "peak_mib": round((mx.get_peak_memory() - before) / 2**20)}

    functions = {"chain, eager": chain, "chain, compiled": mx.compile(chain), "mx.exp": mx.exp,
                 "cpu_math.exp (compiled polynomial)": cpu_math.exp}
    out = {"blas_kernels": blas_description(), "device": str(mx.default_device()), "shape": list(z.shape)}
    for name, f in functions.items():
        out[name] = {
            "alone": timed(lambda f=f: f(z)),
            "in value_and_grad, input stop_gradient": timed(lambda f=f: mx.value_and_grad(
                lambda h: (h * mx.stop_gradient(f(mx.stop_gradient(h)))).sum())(z)),
            "in value_and_grad, differentiated": timed(lambda f=f: mx.value_and_grad(lambda h: f(h).sum())(z)),
        }
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
