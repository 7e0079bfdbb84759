"""Models: loading a policy (the embedded model, mlx-lm folders, Hugging Face ids) and its
trainable part (LoRA/DoRA adapters or full weights), the reference, saving adapters."""
