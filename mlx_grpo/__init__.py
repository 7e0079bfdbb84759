"""mlx-grpo: GRPO-style reinforcement-learning fine-tuning of language models with MLX."""

__version__ = "0.1.0"
