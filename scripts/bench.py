"""Time a GRPO workload with mlx-grpo and, when installed, with mlx-lm-lora.

    python scripts/bench.py                       # tiny random Qwen2, 2 prompts x 4, 32 tokens, 20 steps
    python scripts/bench.py --preset qwen0.5b --group-size 8 --max-tokens 256 --steps 2 --peer off
    python scripts/bench.py --model PATH_OR_HF_ID --prompts 4 --group-size 8

Prints one JSON object: per trainer the median step, rollout and update time
(the first `--warmup` steps left out), rollout and training tokens/s, peak
memory, achieved FLOP/s and its share of a float matmul peak measured in the
same process, and the reward curve; with mlx-lm-lora installed
(`pip install -e ".[bench]"`) the same workload also runs through its GRPO
trainer, one step of each in turn, so that both see the same machine load,
and `speedup` is its median step time over ours.

The model is random (weights from a seed) unless --model is given; its
tokenizer is byte-level, padded with multi-byte tokens up to the vocabulary
size. The reward, the share of ASCII letters in a completion, is something a
random model can learn, so the reward columns show whether learning happens.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlx_grpo.blas import blas_description, loaded_blas, use_openblas
from mlx_grpo.models.heap import keep_freed_memory
from mlx_grpo.device import on_cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
from bench_blas import gflops  # noqa: E402 (the one matmul timing loop)
from script_output import emit_result  # noqa: E402

PRESETS = {
    # The baseline workload.
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512),
    # A larger model that still runs in minutes on a small CPU.
    "small": dict(hidden=256, layers=4, heads=8, kv_heads=2, intermediate=768, vocab=8192),
    # Qwen2.5-0.5B's shape, random weights.
    "qwen0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936),
}
SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# ---------------------------------------------------------------- the workload

def build_random_model(folder: Path, hidden, layers, heads, kv_heads, intermediate, vocab, seed=0,
                       dtype="float32", bits=0, model_type="qwen2") -> Path:
    """A random Qwen2 (or another mlx-lm architecture: "llama") of the given shape with a byte-level
    tokenizer of `vocab` tokens.

    bits 4 or 8: the weights are quantised (nn.quantize, group 64), as in a QLoRA base.
    """
    import importlib
    from itertools import product

    import mlx.nn as nn
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = SPECIALS + alphabet
    # Unreachable by encoding (no merges) but decodable: the random model samples them.
    for n in (2, 3):
        for combo in product(alphabet, repeat=n):
            if len(tokens) >= vocab:
                break
            tokens.append("".join(combo))
    tokens = tokens[:vocab]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "unk_token": "<unk>",
        "pad_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE,
    }))
    config = {
        "model_type": model_type, "hidden_size": hidden, "num_hidden_layers": layers,
        "intermediate_size": intermediate, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-6, "vocab_size": vocab, "tie_word_embeddings": True, "rope_theta": 1000000.0,
        "eos_token_id": 2, "torch_dtype": dtype,
    }
    mx.random.seed(seed)
    architecture = importlib.import_module(f"mlx_lm.models.{model_type}")
    model = architecture.Model(architecture.ModelArgs.from_dict(config))
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
        config["quantization"] = {"group_size": 64, "bits": bits}
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return folder


def dequantized_copy(model: str, folder: Path) -> str:
    """A float32 copy of a (quantized) model, as an mlx-lm folder: the CPU's float matmuls are far faster."""
    from mlx_lm.convert import convert

    from mlx_grpo.models.loading import model_folder
    with contextlib.redirect_stdout(io.StringIO()):
        convert(model_folder(model), mlx_path=str(folder), dequantize=True, dtype="float32")
    return str(folder)


def letter_share(prompts, completions, **columns):
    """Reward: the share of a completion's characters that are ASCII letters."""
    return [sum(c.isascii() and c.isalpha() for c in text) / max(len(text), 1) for text in completions]


def prompt_texts(n: int) -> list[str]:
    return [f"Write a short line of plain English words, number {i + 1}." for i in range(n)]


def model_shape(path: str) -> dict:
    """hidden, layers, heads, ... from a model folder's config.json."""
    from mlx_lm.utils import load_config

    from mlx_grpo.models.loading import model_folder
    local = Path(model_folder(path))  # a GGUF file or alias: its converted folder
    if not local.exists():
        from mlx_lm.utils import _download
        local = Path(_download(path))
    c = load_config(local)
    return dict(hidden=c["hidden_size"], layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
                kv_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
                intermediate=c["intermediate_size"], vocab=c["vocab_size"])


# ---------------------------------------------------------------- FLOPs

def forward_flops(shape: dict, tokens: float, context: float) -> float:
    """Matmul FLOPs of a forward pass over `tokens` positions seeing `context` keys on average."""
    h, layers, v = shape["hidden"], shape["layers"], shape["vocab"]
    head_dim = h // shape["heads"]
    kv = shape["kv_heads"] * head_dim
    weights = layers * (2 * h * h + 2 * h * kv + 3 * h * shape["intermediate"]) + v * h
    attention = layers * 2 * h * context  # QK^T and AV
    return 2 * tokens * (weights + attention)


def step_flops(shape: dict, prompt_lengths: list[int], completion_lengths: list[int], group: int,
               backward_factor: float) -> tuple[float, float]:
    """(rollout, update) useful FLOPs of one step.

    Useful work counts each prompt once per group (what a shared prefill needs)
    and each completion token once. The update is forward + backward:
    `backward_factor` 2 for adapters (gradients of activations, not of the
    frozen weights), 3 for full fine-tuning.
    """
    rollout = update = 0.0
    for i, p in enumerate(prompt_lengths):
        prefill = forward_flops(shape, p, p / 2)
        rollout += prefill
        update += prefill
        for k in completion_lengths[i * group:(i + 1) * group]:
            decode = forward_flops(shape, k, p + k / 2)
            rollout += decode
            update += decode
    return rollout, update * backward_factor


def matmul_peak(dtype, sizes=(512, 1024, 2048), seconds=0.5) -> float:
    """Best FLOP/s of a square matmul of the model's dtype on the default device."""
    return 1e9 * max(gflops(n, n, n, seconds / len(sizes), dtype) for n in sizes)


def machine_limits(model, tokenizer, shape: dict, args) -> dict:
    """What this machine does at the workload's shapes: MLX's bare decode loop at the rollout's width
    (scripts/decode_ceiling.py), and the float matmul rate at an update micro-batch's MLP shape."""
    from decode_loops import bare_loop

    width = args.prompts * args.group_size
    prompt = tokenizer.encode(prompt_texts(1)[0])
    bare = bare_loop(model, prompt, width, min(args.max_tokens, 64))
    rows = min(args.micro_batch_size, width) * (len(prompt) + args.max_tokens)
    rate = gflops(rows, shape["hidden"], shape["intermediate"], 1.0)
    return {"decode_width": width, "bare_decode_step_ms": 1000 * bare, "bare_decode_tok_s": width / bare,
            "update_shape": [rows, shape["hidden"], shape["intermediate"]], "update_shape_sgemm_gflops": rate}


# ---------------------------------------------------------------- the two trainers

def _summary(steps: list[dict], warmup: int, shape: dict, group: int, backward_factor: float, peak: float,
             decoded: bool = True) -> dict:
    timed = steps[warmup:] or steps
    med = lambda key: statistics.median(s[key] for s in timed)  # noqa: E731
    generated = [sum(s["completion_lengths"]) for s in timed]
    flops = [step_flops(shape, s["prompt_lengths"], s["completion_lengths"], group, backward_factor) for s in timed]
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
            model=model_path, task="custom", steps=args.steps, batch_size=len(texts), group_size=args.group_size,
            max_tokens=args.max_tokens, temperature=args.temperature, lr=args.lr, warmup_steps=0,
            scale_rewards="group", kl_every=0, lora_rank=args.lora_rank, lora_layers=args.lora_layers,
            max_grad_norm=args.max_grad_norm, micro_batch_size=args.micro_batch_size,
            decode_concurrency=args.decode_concurrency, logprob_chunk_size=args.logprob_chunk_size, seed=args.seed,
            runaway_penalty=1.0,  # the peer has no length penalty: the same reward for both
        )
        settings.update(overrides or {})
        self.name = name
        self.patch = patch or contextlib.nullcontext
        self.config = TrainConfig.from_flat({k: v for k, v in settings.items() if k in FIELDS})
        self.model, self.tokenizer = load_policy(model_path)
        mx.random.seed(args.seed)  # the same adapter initialisation as the peer
        prepare_for_training(self.model, "lora", {"rank": args.lora_rank, "scale": 20.0, "dropout": 0.0,
                                                  "num_layers": args.lora_layers})
        self.optimizer = make_optimizer(self.config)
        self.task = Task(name="bench", train_rows=[{"prompt": t} for t in texts], eval_rows=[],
                         reward_functions=[letter_share], reward_weights=[1.0], system_prompt=None,
                         accuracy_reward=None, warnings=[])
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
        with self.patch(), _replaced(trainer, "collect_rollouts", rollouts_then_peak), \
                (stops_ignored(self.tokenizer) if self.no_stop else contextlib.nullcontext()):
            metrics, records = trainer.train_step(self.model, self.tokenizer, self.optimizer, self.task, self.config,
                                                  self.step_number, None)
        prompts = {}
        for r in records:
            prompts.setdefault(r["prompt"], len(self._encode(r["prompt"])))
        return {
            "step_s": metrics["time/step_s"], "rollout_s": metrics["time/rollout_s"],
            "update_s": metrics["time/step_s"] - metrics["time/rollout_s"],
            "peak_gb": max(rollout_peak[0], metrics["memory/peak_gb"]), "rollout_peak_gb": rollout_peak[0],
            "update_peak_gb": metrics["memory/peak_gb"], "reward": metrics["reward/mean"],
            "prompt_lengths": list(prompts.values()), "completion_lengths": [r["length"] for r in records],
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
        prepare_for_training(self.model, "lora", {"rank": args.lora_rank, "scale": 20.0, "dropout": 0.0,
                                                  "num_layers": args.lora_layers})
        self.optimizer = optimizer
        self.dataset = [(encode_prompt(self.tokenizer, t), [], t, "") for t in texts]
        self.folder = tempfile.mkdtemp(prefix="bench-peer-")
        self.no_stop = args.no_stop
        self.args = grpo_trainer.GRPOTrainingArgs(
            batch_size=len(texts), iters=1, group_size=args.group_size, beta=0.0,
            max_completion_length=args.max_tokens, temperature=args.temperature, top_p=1.0, top_k=0, min_p=0.0,
            steps_per_report=1, steps_per_eval=10**9, steps_per_save=10**9, max_seq_length=4096,
            adapter_file=os.path.join(self.folder, "adapters.safetensors"), grpo_loss_type="grpo",
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
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                    (stops_ignored(self.tokenizer) if self.no_stop else contextlib.nullcontext()):
                self.trainer.train_grpo(self.model, None, self.tokenizer, self.optimizer, self.dataset,
                                        reward_funcs=[letter_share], args=self.args, training_callback=Report(),
                                        end_answer_token="")
        finally:
            self.trainer.generate_grpo = original
        return {
            "step_s": times["end"] - times["start"], "rollout_s": times["rollout"] - times["start"],
            "update_s": times["end"] - times["rollout"],
            "peak_gb": max(out["rollout_peak"], mx.get_peak_memory() / 1e9), "rollout_peak_gb": out["rollout_peak"],
            "update_peak_gb": mx.get_peak_memory() / 1e9,
            "reward": out["reward"], "prompt_lengths": [len(d[0]) for d in self.dataset],
            "completion_lengths": out["lengths"],
        }


@contextlib.contextmanager
def stops_ignored(tokenizer):
    """Both samplers decode every completion to max_tokens: no token ends one (the same work for both).

    mlx-lm-lora stops at tokenizer.eos_token_ids (and at its end_answer_token,
    empty here); mlx-grpo at rollout.end_token_ids(tokenizer), the same ids.
    Emptied, an end token is sampled like any other and the row goes on.
    """
    from mlx_grpo.sampling import rollout

    saved = set(tokenizer.eos_token_ids)
    tokenizer.eos_token_ids = set()
    try:
        with _replaced(rollout, "end_token_ids", lambda tokenizer: []):
            yield
    finally:
        tokenizer.eos_token_ids = saved


# ---------------------------------------------------------------- variants (timing only)

@contextlib.contextmanager
def _replaced(module, name, value):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def without_shared_prefill():
    """Rollouts prefill every group member's prompt separately, as without sharing."""
    from mlx_grpo.sampling import fixed_decode

    shared = fixed_decode._prefilled_buffers

    def separate(model, prompts, prefix_length, max_tokens):
        rows = [shared(model, [p], prefix_length, max_tokens) for p in prompts]
        return ([mx.concatenate(layer) for layer in zip(*(keys for keys, _ in rows))],
                [mx.concatenate(layer) for layer in zip(*(values for _, values in rows))])

    return _replaced(fixed_decode, "_prefilled_buffers", separate)


def with_generator_decode():
    """Rollouts through mlx-lm's BatchGenerator (growing caches, nothing compiled), as models without plain caches do."""
    from mlx_grpo.sampling import fixed_decode

    return _replaced(fixed_decode, "supports_fixed_decode", lambda model, length=None: False)


def without_merged_adapters():
    """The fixed decoder runs LoRA layers as three matmuls instead of one merged weight."""
    from mlx_grpo.sampling import rollout

    return _replaced(rollout, "adapters_merged", contextlib.nullcontext)


def with_merged_adapters_any_size():
    """LoRA merged into the weights while sampling at any model size (the product merges below MERGE_LIMIT_BYTES)."""
    from mlx_grpo.models import adapters

    return _replaced(adapters, "MERGE_LIMIT_BYTES", float("inf"))


def with_mlx_exp():
    """MLX's own exp, log-sum-exp and SiLU on the CPU instead of models/cpu_math.py's."""
    from mlx_grpo.models import cpu_math

    return _replaced(cpu_math, "on_cpu", lambda: False)


def without_shared_prompt_forward():
    """The update runs every sequence's own copy of its prompt, instead of each prompt once per group."""
    import dataclasses

    import mlx.nn as nn

    from mlx_grpo.update import step
    from mlx_grpo.update.logprobs import prompt_pass

    def per_sequence(model, parts, refs, after_prompt, loss_of):
        for i, mb in enumerate(parts):
            g = mb.group_size
            rows = dataclasses.replace(mb, prompts=mx.repeat(mb.prompts, g, axis=0),
                                       left_padding=mx.repeat(mb.left_padding, g), group_size=1, piece_of=None)

            def loss_fn(model, rows=rows, ref=refs[i] if refs else None):
                logp, entropy = after_prompt(model, prompt_pass(model, rows.prompts, rows.left_padding), rows)
                return loss_of(logp, entropy, rows, ref)

            (loss, stats), grads = nn.value_and_grad(model, loss_fn)(model)
            mx.eval(loss, stats, grads)
            yield loss, stats, grads

    return _replaced(step, "micro_batch_gradients", per_sequence)


def synthetic_rollouts():
    """Completions of exactly max_tokens random tokens, sampled by nobody: for measuring the update alone.

    The longest completions are the update's worst case for memory; decoding them
    for real on a shared 2-core CPU takes far longer than the update itself.
    """
    import importlib

    from mlx_grpo.sampling.rollout import Completion

    def sample(model, tokenizer, prompts, group_size, sampling, *args, **kwargs):
        vocab = model.model.embed_tokens.weight.shape[0]
        rng = np.random.default_rng(len(prompts))
        out = []
        for i, prompt in enumerate(prompts):
            for _ in range(group_size):
                tokens = [int(t) for t in rng.integers(3, vocab, sampling.max_tokens)]  # no end token
                out.append(Completion(i, list(prompt), tokens, [-math.log(vocab)] * len(tokens), "length",
                                      tokenizer.decode(tokens)))
        return out

    stack = contextlib.ExitStack()
    for name in ("mlx_grpo.run.step_rollouts", "mlx_grpo.run.trainer"):  # wherever the trainer calls it from
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "sample_completions"):
            stack.enter_context(_replaced(module, "sample_completions", sample))
    return stack


# name: (setting overrides, patch). Each runs interleaved with the others, so all see the same load.
VARIANTS = {
    "decode_concurrency_2": ({"decode_concurrency": 2}, None),  # the peer's default decode width here
    "no_shared_prefill": ({}, without_shared_prefill),
    "generator_decode": ({}, with_generator_decode),
    "unmerged_adapters": ({}, without_merged_adapters),
    "merged_adapters_any_size": ({}, with_merged_adapters_any_size),
    "no_shared_prompt_forward": ({}, without_shared_prompt_forward),
    "mlx_exp": ({}, with_mlx_exp),
    "logprob_chunk_32": ({"logprob_chunk_size": 32}, None),
    "micro_batch_4": ({"micro_batch_size": 4}, None),
}


def peer_available() -> bool:
    try:
        import mlx_lm_lora.trainer.grpo_trainer  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder or Hugging Face id (default: a random model of --preset)")
    p.add_argument("--preset", choices=PRESETS, default="tiny", help="shape of the random model")
    p.add_argument("--dtype", default="float32", help="random model's dtype (float32, bfloat16, float16)")
    p.add_argument("--dequantize", action="store_true",
                   help="run a float32 copy of --model (quantized weights widened), made in a temporary folder")
    p.add_argument("--quantize", type=int, choices=(0, 4, 8), default=0,
                   help="random model's weights quantised to 4 or 8 bits (a QLoRA base)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-layers", type=int, default=-1)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--micro-batch-size", type=int, default=16)
    p.add_argument("--decode-concurrency", type=int, default=256)
    p.add_argument("--logprob-chunk-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-stop", action="store_true",
                   help="equal work: both trainers decode every completion to --max-tokens (end tokens do not stop)")
    p.add_argument("--synthetic-rollouts", action="store_true",
                   help="skip decoding: every completion is max_tokens random tokens (to measure the update alone)")
    p.add_argument("--variants", default="",
                   help=f"comma-separated variants of ours to run alongside: {', '.join(VARIANTS)}, or all")
    p.add_argument("--peer", choices=("auto", "off", "only"), default="auto",
                   help="also run mlx-lm-lora (auto: when installed), or only it")
    p.add_argument("--blas", choices=("auto", "stock"), default="auto",
                   help="auto: OpenBLAS preloaded when installed on Linux, as the mlx-grpo command does; "
                        "stock: the BLAS MLX came with")
    p.add_argument("--limits", action="store_true",
                   help="also measure MLX's bare decode loop at the rollout's width and the matmul rate at the "
                        "update's shape, and give each trainer's rollout and update as fractions of them")
    p.add_argument("--out", help="also write the JSON here")
    return p.parse_args(argv)


def run(args) -> dict:
    variants = list(VARIANTS) if args.variants == "all" else [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmp:
        if args.model and args.dequantize:
            model_path = dequantized_copy(args.model, Path(tmp) / "float32")
            shape = model_shape(model_path)
        elif args.model:
            model_path, shape = args.model, model_shape(args.model)
        else:
            shape = PRESETS[args.preset]
            model_path = str(build_random_model(Path(tmp), **shape, seed=args.seed, dtype=args.dtype,
                                                bits=args.quantize))
        texts = prompt_texts(args.prompts)
        peer_wanted = args.peer == "only" or (args.peer == "auto" and peer_available())
        if args.peer == "only" and not peer_available():
            raise SystemExit("error: --peer only needs mlx-lm-lora (pip install -e '.[bench]')")

        ours = Ours(model_path, texts, args)
        trainers = [] if args.peer == "only" else [ours]
        trainers += [Ours(model_path, texts, args, name, *VARIANTS[name]) for name in variants]
        if peer_wanted:
            from mlx_grpo.run.trainer import make_optimizer
            trainers.append(Peer(model_path, texts, args, make_optimizer(ours.config)))
        if args.peer == "only":
            del ours
        dtype = next(v.dtype for _, v in tree_flatten(trainers[0].model.parameters())
                     if mx.issubdtype(v.dtype, mx.floating))
        peak = matmul_peak(dtype, sizes=(512, 1024) if on_cpu() else (2048, 4096, 8192))

        results = {t.name: [] for t in trainers}
        with synthetic_rollouts() if args.synthetic_rollouts else contextlib.nullcontext():
            for _ in range(args.steps):  # one step of each in turn: both see the same load
                for t in trainers:
                    results[t.name].append(t.step())
        limits = None
        if args.limits:  # measured after the steps, on the same model and machine load
            trainers[0].model.eval()
            limits = machine_limits(trainers[0].model, trainers[0].tokenizer, shape, args)

        prompt_tokens = [len(d[0]) for d in trainers[-1].dataset] if peer_wanted else \
            [len(ours._encode(t)) for t in texts]
        out = {
            "workload": {"model": args.model or f"random {args.preset}", **shape, "dtype": str(dtype),
                         "prompts": args.prompts, "group_size": args.group_size, "max_tokens": args.max_tokens,
                         "steps": args.steps, "lora_rank": args.lora_rank, "lora_layers": args.lora_layers,
                         "decode_concurrency": args.decode_concurrency, "micro_batch_size": args.micro_batch_size,
                         "quantized_bits": args.quantize or None,
                         "logprob_chunk_size": args.logprob_chunk_size, "synthetic_rollouts": args.synthetic_rollouts,
                         "no_stop": args.no_stop,
                         "prompt_tokens": prompt_tokens},
            "device": str(mx.default_device()),
            # 1, 5 and 15-minute load averages at the start and end (a shared machine: other work slows both)
            "load_average": {"start": [round(x, 2) for x in load_start],
                             "end": [round(x, 2) for x in os.getloadavg()]},
            "blas": loaded_blas(),
            "blas_kernels": blas_description(),  # the kernels every figure here ran on
            "matmul_peak_gflops": peak / 1e9,
        }
        for name, steps in results.items():
            out[name] = _summary(steps, args.warmup, shape, args.group_size, 2.0, peak,
                                 decoded=not (args.synthetic_rollouts and name != "mlx_lm_lora"))
            if limits:  # each trainer as a fraction of what the machine does at its shapes
                out[name]["rollout_frac_of_bare_decode"] = out[name]["rollout_tokens_per_s"] / limits["bare_decode_tok_s"]
                out[name]["update_frac_of_sgemm"] = out[name]["update_gflops"] / limits["update_shape_sgemm_gflops"]
        if limits:
            out["limits"] = limits
        if "mlx_grpo" in out and "mlx_lm_lora" in out:
            ours, peer = out["mlx_grpo"], out["mlx_lm_lora"]
            out["speedup"] = peer["step_s"] / ours["step_s"]
            # Step times compare equal work only when the completions are about as long.
            out["speedup_per_token"] = peer["step_s_per_1k_tokens"] / ours["step_s_per_1k_tokens"]
            out["update_speedup_per_token"] = ours["train_tokens_per_s"] / peer["train_tokens_per_s"]
            out["completion_length_ratio"] = peer["mean_completion_tokens"] / ours["mean_completion_tokens"]
            out["memory_ratio"] = ours["peak_memory_gb"] / peer["peak_memory_gb"]
        for name in variants:  # how much slower ours gets without each measure
            out[name]["step_s_vs_ours"] = out[name]["step_s"] / out["mlx_grpo"]["step_s"]
    return out


TABLE_COLUMNS = [  # (heading, key in a trainer's summary, format)
    ("step s", "step_s", ".2f"), ("rollout s", "rollout_s", ".2f"), ("update s", "update_s", ".2f"),
    ("tokens/completion", "mean_completion_tokens", ".1f"), ("step s / 1k tokens", "step_s_per_1k_tokens", ".2f"),
    ("rollout tok/s", "rollout_tokens_per_s", ".0f"), ("update tok/s", "train_tokens_per_s", ".0f"),
    ("peak GB", "peak_memory_gb", ".2f"), ("rollout / update peak GB", None, None),
]


def table(out: dict) -> str:
    """The trainers' figures as a Markdown table."""
    lines = ["| trainer | " + " | ".join(h for h, _, _ in TABLE_COLUMNS) + " |",
             "|---" * (len(TABLE_COLUMNS) + 1) + "|"]
    for name, figures in out.items():
        if not (isinstance(figures, dict) and "step_s" in figures):
            continue
        cells = [format(figures[key], fmt) if key else
                 f"{figures['rollout_peak_memory_gb']:.2f} / {figures['update_peak_memory_gb']:.2f}"
                 for _, key, fmt in TABLE_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.blas == "auto" and argv is None:
        use_openblas()  # re-executes this script with OpenBLAS preloaded, when there is one
        keep_freed_memory()  # as the mlx-grpo command does (models/heap.py)
    out = run(args)
    emit_result(out, args.out, table(out))


if __name__ == "__main__":
    main()
