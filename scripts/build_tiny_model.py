"""Build the embedded tiny model for the "arith" task: mlx_grpo/assets/tiny-arith/.

    python scripts/build_tiny_model.py [--seed 0] [--steps N] [--out DIR]

What it makes, deterministically from the seed:

* a byte-level BPE Hugging Face tokenizer (``tokenizers``, Qwen2's text pipeline) whose
  merges make each word of the task one token, every digit its own token, with a
  Qwen-style chat template ending turns with ``<|im_end|>``;
* a small Qwen2 model (mlx-lm's ``qwen2`` architecture, about 150k parameters),
  pre-trained by supervised learning on worked solutions of the train split, through
  the chat template, with the loss on the solution and its end token only.

Why so small: MLX's CPU backend multiplies float32 matrices at a few GFLOP/s on a
reference BLAS. In the same minutes a 2-layer, 64-wide model learns the task (copying the
operands, the arithmetic facts, the final line) while a 0.45M-parameter one is still
learning to copy the second operand; and every RL step afterwards is cheaper too.

The supervised data is deliberately inconsistent, to leave reinforcement learning an easy
way up. For each kind of problem (template) the worked solution uses the right operation
only with a template-specific probability, and otherwise a plausible systematic mistake
(adding instead of subtracting, forgetting the second step, ...). The trained model then
knows both ways: greedy decoding follows the more frequent one for each template (right
on some templates, wrong on others), while sampling at temperature 1.0 often produces the
right answer. Rewarding the right answers shifts that one choice per template.

At the end it measures greedy accuracy, sampled accuracy and pass@8 at temperature 1.0 on
the first 200 problems of ``generate_problems(200, seed=0, split="test")`` (tiny_arith_eval.py)
and writes them with the settings to ``build_info.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rewards import arith  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
from tiny_arith_eval import evaluate, prompt_ids  # noqa: E402 (the chat prompt, the final measurement)

DEFAULT_OUT = ROOT / "mlx_grpo" / "assets" / "tiny-arith"

# ---------------------------------------------------------------------------------------
# What the supervised data teaches: per template, how often the worked solution is right,
# and the mistake it makes otherwise. Templates above 0.5 come out right under greedy
# decoding, those below come out wrong; all are right often when sampled.
# ---------------------------------------------------------------------------------------

P_CORRECT = {
    "add": 0.85,  # "buys b more": kept high, it holds the opposite choice (+ over -) to
    #               give/fewer, so RL's first push towards "-" must not flip it
    "groups": 0.7,  # "a bags with b in each"
    "two_step": 0.4,  # "buys b more, then loses c"
    "give": 0.3,  # "gives b to a friend"
    "fewer": 0.25,  # "b fewer than"
}


def mistaken_steps(template: str, numbers: list[int]) -> list[tuple[int, str, int]]:
    """The systematic mistake for a template: the wrong operation or a forgotten step."""
    if template == "add":
        a, b = numbers
        return [(a, "-", b)]  # subtracts instead of adding
    if template in ("give", "fewer", "groups"):
        a, b = numbers[:2]
        return [(a, "+", b)]  # adds instead of subtracting / multiplying
    if template == "two_step":
        a, b, _ = numbers
        return [(a, "+", b)]  # stops after the first step
    raise ValueError(f"unknown template {template!r}")


# ---------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]

# The text pipeline of Qwen2's tokenizer (transformers 5 rebuilds exactly this one for any
# model_type "qwen2", whatever tokenizer.json says, so ours must be the same): NFC, split
# into words with their leading space, single digits (numbers are spelled digit by digit),
# punctuation runs and newlines, then byte-level encoding. Decoding reverses it exactly.
QWEN2_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen-style chat format: "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n".
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def tokenizer_corpus() -> list[str]:
    """Text the tokenizer's merges are learnt from: problems, solutions, mistakes, roles."""
    texts = ["user", "assistant", "system"]
    for split in ("train", "test"):
        for problem in arith.generate_problems(3000, seed=0, split=split):
            texts.append(problem["prompt"])
            texts.append(problem["solution"])
            texts.append(arith.format_solution(mistaken_steps(problem["template"], problem["numbers"]))[0])
    return texts


def build_tokenizer():
    """A byte-level BPE tokenizer whose merges make every word of the task one token.

    The 256 byte symbols keep any text encodable; merges are learnt until no pair is
    left, so each word (with its leading space) of the task's text is a single token.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,  # an upper bound: training stops once every word is whole
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer, out: Path) -> None:
    """tokenizer.json plus the transformers config files (chat template, special tokens)."""
    tokenizer.save(str(out / "tokenizer.json"))
    # Byte-level BPE never needs an unknown token; like Qwen, <|endoftext|> stands in.
    special = {"eos_token": IM_END, "pad_token": PAD, "unk_token": PAD}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        **special,
        "additional_special_tokens": [IM_START, IM_END],
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 256,
        "added_tokens_decoder": {
            str(tokenizer.token_to_id(tok)): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for tok in SPECIAL_TOKENS
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special_map = {**special, "additional_special_tokens": [IM_START, IM_END]}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------


def model_config(
    vocab_size: int,
    eos_id: int,
    hidden: int = 64,
    layers: int = 2,
    intermediate: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
) -> dict:
    """config.json of the tiny Qwen2 model."""
    return {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def make_model(config: dict):
    from mlx_lm.models.qwen2 import Model, ModelArgs

    return Model(ModelArgs.from_dict(config))


def count_parameters(model) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))


# ---------------------------------------------------------------------------------------
# Supervised data
# ---------------------------------------------------------------------------------------


def sft_example(tokenizer, problem: dict, rng: random.Random, eos_id: int):
    """(token ids, index where the completion starts) with the right or mistaken solution."""
    template, numbers = problem["template"], problem["numbers"]
    if rng.random() < P_CORRECT[template]:
        steps = arith.correct_steps(template, numbers)
    else:
        steps = mistaken_steps(template, numbers)
    solution, _ = arith.format_solution(steps)
    prompt = prompt_ids(tokenizer, problem["prompt"])
    completion = tokenizer.encode(solution, add_special_tokens=False) + [eos_id]
    return prompt + completion, len(prompt)


def sft_batches(examples, batch_size: int, rng: random.Random, pad_id: int):
    """Batches of similar lengths (less padding) in random order, as (ids, loss mask)."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    chunk = batch_size * 16
    batches = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: len(examples[i][0]))
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    for batch in batches:
        width = max(len(examples[i][0]) for i in batch)
        ids, mask = [], []
        for i in batch:
            tokens, start = examples[i]
            pad = width - len(tokens)
            ids.append(tokens + [pad_id] * pad)
            # Mask on targets: position t predicts token t + 1; learn completion tokens only.
            mask.append([0] * (start - 1) + [1] * (len(tokens) - start) + [0] * (pad + 1))
        yield mx.array(ids), mx.array(mask, dtype=mx.float32)


def masked_loss(model, ids, mask):
    logits = model(ids[:, :-1])
    losses = nn.losses.cross_entropy(logits, ids[:, 1:])
    return (losses * mask[:, :-1]).sum() / mask.sum()


# ---------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------


def train(model, batches, steps: int, lr: float, warmup: int, log_every: int = 50):
    """AdamW with linear warmup and cosine decay; returns the loss history."""
    schedule = optim.join_schedules(
        [optim.linear_schedule(lr / 20, lr, warmup), optim.cosine_decay(lr, steps - warmup, lr / 50)],
        [warmup],
    )
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
    loss_and_grad = nn.value_and_grad(model, masked_loss)

    # Not mx.compile'd: batch widths vary, and retracing for each width costs more than
    # compiling saves for a model this small.
    def step(ids, mask):
        loss, grads = loss_and_grad(model, ids, mask)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        return loss

    history = []
    start = time.time()
    running = None
    for i in range(steps):
        ids, mask = next(batches)
        loss = step(ids, mask)
        mx.eval(loss, model.parameters(), optimizer.state)
        loss = loss.item()
        running = loss if running is None else 0.95 * running + 0.05 * loss
        if (i + 1) % log_every == 0 or i == 0:
            history.append({"step": i + 1, "loss": round(running, 4)})
            print(f"step {i + 1:5d}  loss {running:.4f}  {time.time() - start:6.1f}s", flush=True)
    return history


def endless(make_epoch):
    """Repeat an epoch generator forever."""
    while True:
        yield from make_epoch()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1800)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--examples", type=int, default=30_000, help="supervised examples drawn")
    parser.add_argument("--eval-problems", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()

    started = time.time()
    random_state = random.Random(f"build/{args.seed}")
    mx.random.seed(args.seed)

    # Everything is written to a staging folder that replaces the output folder at the end.
    staging = args.out.with_name(args.out.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    hf_tokenizer = build_tokenizer()
    save_tokenizer(hf_tokenizer, staging)
    print(f"tokenizer: {hf_tokenizer.get_vocab_size()} tokens")
    eos_id = hf_tokenizer.token_to_id(IM_END)
    pad_id = hf_tokenizer.token_to_id(PAD)
    config = model_config(
        hf_tokenizer.get_vocab_size(),
        eos_id,
        args.hidden,
        args.layers,
        args.intermediate,
        args.heads,
        args.kv_heads,
    )
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    # Load the tokenizer the way users will (mlx-lm's wrapper around transformers).
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(staging)

    model = make_model(config)
    mx.eval(model.parameters())
    n_params = count_parameters(model)
    print(f"model: {n_params:,} parameters, vocab {config['vocab_size']}")

    problems = arith.generate_problems(args.examples, seed=args.seed, split="train")
    examples = [sft_example(tokenizer, p, random_state, eos_id) for p in problems]
    prompt_lengths = [start for _, start in examples]
    completion_lengths = [len(ids) - start for ids, start in examples]
    mean_len = sum(len(ids) for ids, _ in examples) / len(examples)
    mean_completion = sum(completion_lengths) / len(examples)
    print(f"data: {len(examples)} examples, {mean_len:.1f} tokens each ({mean_completion:.1f} completion)")

    batches = endless(lambda: sft_batches(examples, args.batch_size, random_state, pad_id))
    warmup = max(1, args.steps // 20)
    train_start = time.time()
    history = train(model, batches, args.steps, args.lr, warmup)
    train_seconds = time.time() - train_start

    model.eval()
    test = arith.generate_problems(args.eval_problems, seed=0, split="test")
    eval_start = time.time()
    metrics = evaluate(model, tokenizer, test, eos_id, seed=args.seed)
    print(
        f"eval ({time.time() - eval_start:.0f}s): greedy {metrics['greedy_accuracy']:.3f}  "
        f"sampled {metrics['sampled_accuracy']:.3f}  pass@8 {metrics['pass@8']:.3f}"
    )
    for t, m in metrics["per_template"].items():
        print(f"  {t:9s} {m}")

    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(staging / "model.safetensors"), weights, metadata={"format": "mlx"})
    info = {
        "seed": args.seed,
        "parameters": n_params,
        "config": config,
        "vocab_size": config["vocab_size"],
        "p_correct_in_sft_data": P_CORRECT,
        "sft": {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "warmup_steps": warmup,
            "examples": len(examples),
            "mean_tokens_per_example": round(mean_len, 2),
            "mean_completion_tokens": round(mean_completion, 2),
            "prompt_tokens_min_max": [min(prompt_lengths), max(prompt_lengths)],
            "completion_tokens_min_max": [min(completion_lengths), max(completion_lengths)],
            "train_seconds": round(train_seconds, 1),
            "loss_history": history,
        },
        "eval": {
            "problem_set": f'arith.generate_problems({args.eval_problems}, seed=0, split="test")',
            "greedy": "temperature 0",
            "sampled": "temperature 1.0, 8 samples per problem",
            "max_tokens": 40,
            **metrics,
        },
        "build_seconds": round(time.time() - started, 1),
    }
    (staging / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    # Replace the old folder only once everything is written.
    shutil.rmtree(args.out, ignore_errors=True)
    staging.rename(args.out)
    print(f"wrote {args.out} in {info['build_seconds']:.0f}s")


if __name__ == "__main__":
    main()
