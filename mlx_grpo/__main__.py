"""The `mlx-grpo` command (also `python -m mlx_grpo`).

On Linux with MLX's CPU backend the process re-executes itself once with
OpenBLAS preloaded (see blas.py). Doing that here, before the CLI's imports
(transformers, datasets, ...), means the slow imports happen once, not twice.
The command's process is ours, so it also keeps freed memory for reuse
(models/heap.py); the Python API changes neither unless its caller asks.
"""


def main():
    from .blas import loaded_blas, use_openblas

    use_openblas()  # MLX_GRPO_OPENBLAS=0 turns it off
    from .models.heap import keep_freed_memory

    keep_freed_memory()  # every step's large temporaries reused, not faulted in again
    from .cli import main as cli_main

    try:
        cli_main()
    except SystemExit as e:
        if loaded_blas() != "openblas":
            raise
        _exit_past_openblas(e.code)


def _exit_past_openblas(code) -> None:
    """End the process without the C libraries' exit handlers, once Python's own have run.

    Debian's preloaded OpenBLAS joins its worker threads in its exit handler, and
    that join sometimes never returns (seen twice after `train` had written
    everything: gdb showed blas_thread_shutdown_ in pthread_join while the
    worker waited on its condition variable, beside numpy's own OpenBLAS). By
    then every file is written and closed; Python's atexit handlers (loggers,
    thread pools) still run here, then the process ends.
    """
    import atexit
    import os
    import sys

    status = code if isinstance(code, int) else (0 if code is None else 1)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
