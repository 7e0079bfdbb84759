"""The `mlx-grpo` command line: a thin layer over the Python API.

Mistakes a user can make (a bad flag value, a missing file, a broken config)
end with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from .config import ConfigError, build_config
from .data import DataError

app = typer.Typer(add_completion=False, no_args_is_help=False,
                  help="GRPO-style reinforcement-learning fine-tuning of language models with MLX.")
err = Console(stderr=True)


def fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.callback()
def _root():
    """GRPO-style reinforcement-learning fine-tuning of language models with MLX."""


@app.command()
def train(
    model: Optional[str] = typer.Option(None, help="Local mlx-lm model folder or Hugging Face id. Default: the embedded tiny model."),
    data: Optional[str] = typer.Option(None, help="JSONL of {\"prompt\", ...} rows, a folder with train.jsonl/test.jsonl, or a dataset name."),
    task: Optional[str] = typer.Option(None, help="Built-in task: arith (default), or custom (with --data and --reward-file)."),
    reward_file: Optional[Path] = typer.Option(None, help="Python file with reward functions fn(prompts, completions, **columns)."),
    reward: Optional[List[str]] = typer.Option(None, help="Reward function name (repeat for several)."),
    reward_weights: Optional[str] = typer.Option(None, help="Comma-separated weights, one per --reward."),
    system_prompt: Optional[str] = typer.Option(None, help="System prompt (overrides the task's)."),
    config: Optional[Path] = typer.Option(None, help="YAML file of settings; typed flags override it."),
    steps: Optional[int] = typer.Option(None, help="Number of GRPO steps."),
    batch_size: Optional[int] = typer.Option(None, help="Prompts per step."),
    group_size: Optional[int] = typer.Option(None, help="Completions sampled per prompt."),
    max_tokens: Optional[int] = typer.Option(None, help="Completion length limit in tokens."),
    temperature: Optional[float] = typer.Option(None, help="Sampling temperature of the rollouts."),
    top_p: Optional[float] = typer.Option(None, help="Nucleus sampling threshold (1 = off)."),
    top_k: Optional[int] = typer.Option(None, help="Top-k sampling (0 = off)."),
    min_p: Optional[float] = typer.Option(None, help="Min-p sampling (0 = off)."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate (AdamW, warmup then cosine)."),
    loss: Optional[str] = typer.Option(None, help="Objective: grpo | bnpo | dr_grpo | dapo (normalisation of the clipped loss)."),
    num_iterations: Optional[int] = typer.Option(None, help="Updates per rollout batch (>1 reuses rollouts: ratio and clipping matter)."),
    epsilon_low: Optional[float] = typer.Option(None, help="Lower clip range: ratio >= 1 - epsilon_low."),
    epsilon_high: Optional[float] = typer.Option(None, help="Upper clip range: ratio <= 1 + epsilon_high."),
    beta: Optional[float] = typer.Option(None, help="Weight of the KL (k3) penalty to the reference model."),
    scale_rewards: Optional[str] = typer.Option(None, help="Advantage scaling: none (default) | group | batch."),
    max_grad_norm: Optional[float] = typer.Option(None, help="Global gradient-norm clip."),
    fine_tune_type: Optional[str] = typer.Option(None, help="lora (default) | dora | full."),
    lora_rank: Optional[int] = typer.Option(None, help="LoRA rank."),
    micro_batch_size: Optional[int] = typer.Option(None, help="Sequences per forward/backward (gradients are accumulated)."),
    decode_concurrency: Optional[int] = typer.Option(None, help="Sequences decoded at once during rollouts."),
    eval_steps: Optional[int] = typer.Option(None, help="Evaluate every N steps (0: only before and after)."),
    eval_num_problems: Optional[int] = typer.Option(None, help="Held-out problems for the accuracy measurement."),
    seed: Optional[int] = typer.Option(None, help="Seed: the same seed gives the same run."),
    output: Optional[Path] = typer.Option(None, help="Run folder (default checkpoints/<task>-<time>)."),
    resume: Optional[Path] = typer.Option(None, help="Continue the run in this folder from its last checkpoint."),
    save_every: Optional[int] = typer.Option(None, help="Checkpoint every N steps (and at the end)."),
):
    """Train a model with GRPO. With no arguments: the embedded tiny model on the arith task."""
    flags = {k: v for k, v in locals().items() if k not in ("config", "resume")}
    for key in ("reward_file", "output"):
        flags[key] = str(flags[key]) if flags[key] is not None else None
    flags["reward"] = list(reward) if reward else None
    config_file = str(config) if config else None
    if resume is not None:
        if not (resume / "config.yaml").is_file():
            fail(f"--resume {resume}: not a run folder (no config.yaml)")
        config_file = config_file or str(resume / "config.yaml")
        flags["resume"] = str(resume)
        flags["output"] = str(resume)

    from .tasks import recommended_settings
    from .display import TrainDisplay
    from .trainer import train as run_training

    try:
        cfg = build_config(flags, config_file, task_defaults=recommended_settings)
        display = TrainDisplay(log_every=cfg.log_every)
        try:
            run_training(cfg, on_event=display)
        finally:
            display.stop()
    except (ConfigError, DataError, FileNotFoundError) as e:
        fail(str(e))


def main():
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
