"""The two trainers bench.py times on one workload, one step per call: mlx-grpo's own train_step (`Ours`,
also as a variant) and mlx-lm-lora's train_grpo (`Peer`); and `summary`, a trainer's steps as medians,
rates and FLOP/s.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import tempfile
import time

import mlx.core as mx
import numpy as np

from bench_variants import replaced, stops_ignored
from bench_workload import letter_share, step_flops


def summary(
    steps: list[dict],
    warmup: int,
    shape: dict,
    group: int,
    backward_factor: float,
    peak: float,
    decoded: bool = True,
) -> dict:
    """A trainer's steps after the first `warmup`: median seconds, tokens/s and FLOP/s (`peak`: the matmul
    peak they are a share of), peak memory, and the reward curve (of every step)."""
    timed = steps[warmup:] or steps
    med = lambda key: statistics.median(s[key] for s in timed)  # noqa: E731
    generated = [sum(s["completion_lengths"]) for s in timed]
    flops = [
        step_flops(shape, s["prompt_lengths"], s["completion_lengths"], group, backward_factor) for s in timed
    ]
    if not decoded:  # synthetic rollouts: nothing was decoded
        flops = [(0.0, u) for _, u in flops]
    achieved = statistics.median((r + u) / s["step_s"] for (r, u), s in zip(flops, timed))
    rewards = [s["reward"] for s in steps]
    tail = max(1, len(rewards) // 4)
    return {
        "step_s": med("step_s"),
        "rollout_s": med("rollout_s"),
        "update_s": med("update_s"),
        # Per generated token: comparable when the two trainers' completions differ in length.
        "step_s_per_1k_tokens": statistics.median(1000 * s["step_s"] / g for g, s in zip(generated, timed)),
        "rollout_tokens_per_s": statistics.median(g / s["rollout_s"] for g, s in zip(generated, timed)),
        "train_tokens_per_s": statistics.median(g / s["update_s"] for g, s in zip(generated, timed)),
        "peak_memory_gb": max(s["peak_gb"] for s in steps),
        "rollout_peak_memory_gb": max(s["rollout_peak_gb"] for s in steps),
        "update_peak_memory_gb": max(s["update_peak_gb"] for s in steps),
        "achieved_gflops": achieved / 1e9,
        "achieved_frac_of_peak": achieved / peak if peak else None,
        "rollout_gflops": statistics.median(r / s["rollout_s"] for (r, _), s in zip(flops, timed)) / 1e9,
        "update_gflops": statistics.median(u / s["update_s"] for (_, u), s in zip(flops, timed)) / 1e9,
        "mean_completion_tokens": float(np.mean([np.mean(s["completion_lengths"]) for s in steps])),
        "mean_completion_tokens_per_step": [round(float(np.mean(s["completion_lengths"])), 1) for s in steps],
        "reward_first": float(np.mean(rewards[:tail])),
        "reward_last": float(np.mean(rewards[-tail:])),
        "rewards": [round(r, 4) for r in rewards],
        "steps_timed": len(timed),
    }


class Ours:
    """mlx-grpo's own train_step on the workload, optionally as a variant (other settings, a patch)."""

    def __init__(self, model_path: str, texts: list[str], args, name="mlx_grpo", overrides=None, patch=None):
        from mlx_grpo.config import FIELDS, TrainConfig
        from mlx_grpo.models.adapters import prepare_for_training
        from mlx_grpo.models.loading import load_policy
        from mlx_grpo.run.trainer import make_optimizer
        from mlx_grpo.tasks.registry import Task

        settings = dict(
            model=model_path,
            task="custom",
            steps=args.steps,
            batch_size=len(texts),
            group_size=args.group_size,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            lr=args.lr,
            warmup_steps=0,
            scale_rewards="group",
            kl_every=0,
            lora_rank=args.lora_rank,
            lora_layers=args.lora_layers,
            max_grad_norm=args.max_grad_norm,
            micro_batch_size=args.micro_batch_size,
            decode_concurrency=args.decode_concurrency,
            logprob_chunk_size=args.logprob_chunk_size,
            seed=args.seed,
            runaway_penalty=1.0,  # the peer has no length penalty: the same reward for both
        )
        settings.update(overrides or {})
        self.name = name
        self.patch = patch or contextlib.nullcontext
        self.config = TrainConfig.from_flat({k: v for k, v in settings.items() if k in FIELDS})
        self.model, self.tokenizer = load_policy(model_path)
        mx.random.seed(args.seed)  # the same adapter initialisation as the peer
        prepare_for_training(
            self.model,
            "lora",
            {"rank": args.lora_rank, "scale": 20.0, "dropout": 0.0, "num_layers": args.lora_layers},
        )
        self.optimizer = make_optimizer(self.config)
        self.task = Task(
            name="bench",
            train_rows=[{"prompt": t} for t in texts],
            eval_rows=[],
            reward_functions=[letter_share],
            reward_weights=[1.0],
            system_prompt=None,
            accuracy_reward=None,
            warnings=[],
        )
        self.step_number = 0
        self.no_stop = args.no_stop

    def step(self) -> dict:
        from mlx_grpo.run import trainer

        self.step_number += 1
        rollout_peak = []

        def rollouts_then_peak(*a, **kw):  # the rollout's peak, then a fresh one for the update
            result = collect(*a, **kw)
            rollout_peak.append(mx.get_peak_memory() / 1e9)
            mx.reset_peak_memory()
            return result

        collect = trainer.collect_rollouts
        with (
            self.patch(),
            replaced(trainer, "collect_rollouts", rollouts_then_peak),
            stops_ignored(self.tokenizer) if self.no_stop else contextlib.nullcontext(),
        ):
            metrics, records = trainer.train_step(
                self.model, self.tokenizer, self.optimizer, self.task, self.config, self.step_number, None
            )
        prompts = {}
        for r in records:
            prompts.setdefault(r["prompt"], len(self._encode(r["prompt"])))
        return {
            "step_s": metrics["time/step_s"],
            "rollout_s": metrics["time/rollout_s"],
            "update_s": metrics["time/step_s"] - metrics["time/rollout_s"],
            "peak_gb": max(rollout_peak[0], metrics["memory/peak_gb"]),
            "rollout_peak_gb": rollout_peak[0],
            "update_peak_gb": metrics["memory/peak_gb"],
            "reward": metrics["reward/mean"],
            "prompt_lengths": list(prompts.values()),
            "completion_lengths": [r["length"] for r in records],
        }

    def _encode(self, text):
        from mlx_grpo.tasks.data import encode_prompt

        return encode_prompt(self.tokenizer, text)


class Peer:
    """mlx-lm-lora 5.10.2's train_grpo on the same workload, one step per call."""

    name = "mlx_lm_lora"

    def __init__(self, model_path: str, texts: list[str], args, optimizer):
        from mlx_grpo.tasks.data import encode_prompt
        from mlx_lm_lora.trainer import grpo_trainer

        from mlx_grpo.models.adapters import prepare_for_training
        from mlx_grpo.models.loading import load_policy

        self.trainer = grpo_trainer
        self.model, self.tokenizer = load_policy(model_path)
        mx.random.seed(args.seed)
        prepare_for_training(
            self.model,
            "lora",
            {"rank": args.lora_rank, "scale": 20.0, "dropout": 0.0, "num_layers": args.lora_layers},
        )
        self.optimizer = optimizer
        self.dataset = [(encode_prompt(self.tokenizer, t), [], t, "") for t in texts]
        self.folder = tempfile.mkdtemp(prefix="bench-peer-")
        self.no_stop = args.no_stop
        self.args = grpo_trainer.GRPOTrainingArgs(
            batch_size=len(texts),
            iters=1,
            group_size=args.group_size,
            beta=0.0,
            max_completion_length=args.max_tokens,
            temperature=args.temperature,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            steps_per_report=1,
            steps_per_eval=10**9,
            steps_per_save=10**9,
            max_seq_length=4096,
            adapter_file=os.path.join(self.folder, "adapters.safetensors"),
            grpo_loss_type="grpo",
        )

    def step(self) -> dict:
        from mlx_lm.tuner.callbacks import TrainingCallback

        times, out = {}, {}
        original = self.trainer.generate_grpo

        def timed_generate(*a, **kw):
            times["start"] = time.perf_counter()
            result = original(*a, **kw)
            times["rollout"] = time.perf_counter()
            out["lengths"] = [int(c.size) for c in result[0]]
            out["rollout_peak"] = mx.get_peak_memory() / 1e9
            mx.reset_peak_memory()
            return result

        class Report(TrainingCallback):
            def on_train_loss_report(self, info):
                times["end"] = time.perf_counter()
                out["reward"] = info["train_total_rewards_mean"]

        self.trainer.generate_grpo = timed_generate
        mx.reset_peak_memory()
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
                stops_ignored(self.tokenizer) if self.no_stop else contextlib.nullcontext(),
            ):
                self.trainer.train_grpo(
                    self.model,
                    None,
                    self.tokenizer,
                    self.optimizer,
                    self.dataset,
                    reward_funcs=[letter_share],
                    args=self.args,
                    training_callback=Report(),
                    end_answer_token="",
                )
        finally:
            self.trainer.generate_grpo = original
        return {
            "step_s": times["end"] - times["start"],
            "rollout_s": times["rollout"] - times["start"],
            "update_s": times["end"] - times["rollout"],
            "peak_gb": max(out["rollout_peak"], mx.get_peak_memory() / 1e9),
            "rollout_peak_gb": out["rollout_peak"],
            "update_peak_gb": mx.get_peak_memory() / 1e9,
            "reward": out["reward"],
            "prompt_lengths": [len(d[0]) for d in self.dataset],
            "completion_lengths": out["lengths"],
        }
