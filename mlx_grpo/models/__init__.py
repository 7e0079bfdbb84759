"""Models: loading a policy (the embedded model, mlx-lm folders, GGUF files, packaged aliases,
Hugging Face ids), its trainable part (LoRA/DoRA adapters or full weights), the reference,
saving adapters, and exporting a trained model (GGUF, MLX folder)."""
