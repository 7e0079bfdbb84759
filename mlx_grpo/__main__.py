"""The `mlx-grpo` command (also `python -m mlx_grpo`).

On Linux with MLX's CPU backend the process re-executes itself once with
OpenBLAS preloaded (see blas.py). Doing that here, before the CLI's imports
(transformers, datasets, ...), means the slow imports happen once, not twice.
"""


def main():
    from .blas import use_openblas

    use_openblas()  # MLX_GRPO_OPENBLAS=0 turns it off
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
