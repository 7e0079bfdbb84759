"""Build the tiny web model: rewards/web_browsing/assets/tiny-web/.

    python scripts/build_tiny_web_model.py [--seed 0] [--steps N]

A byte-level BPE tokenizer whose merges are learnt from the simulated web's
pages and actions (so a page is tens of tokens, not hundreds), and a tiny
Qwen2 model (mlx-lm's qwen2, about 150k parameters) pre-trained by supervised
learning on whole "fact/1" episodes through the chat template: a country's article,
the model's click on its capital, the capital's article, the model's answer. The loss covers the
model's turns only.

Like the arithmetic model, the trajectories are deliberately imperfect, to
leave reinforcement learning a way up: the model follows the link
with probability P_CLICK (otherwise the episode answers at once with a line
of the country's page), and the answer reads the asked-for line of the city's
article with a per-question probability (P_ANSWER), otherwise the other line.
Half the pre-training episodes ask for the capital's founding year instead
of its river (the task itself asks for the river): the model sees both lines
used, and a 200k model cannot copy a 4-digit year anyway, which leaves the
river questions between always and never solved.
The script ends by measuring the success rate of greedy and sampled (T = 1)
episodes on held-out tasks and writes everything to build_info.json.
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
from mlx.utils import tree_flatten

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import build_tiny_model as base  # noqa: E402  (tokenizer files, model config, SFT loop)

from rewards.web_browsing import WebEnv, generate_tasks  # noqa: E402
from rewards.web_browsing.tiny_model import TINY_WEB_MODEL  # noqa: E402

P_CLICK = 0.7  # follows the capital's link first; otherwise answers at once from the country's page
P_ANSWER = {"river": 0.55, "founded": 0.4}  # reads the asked-for line; otherwise the other one
TRAIN_SEED, TEST_SEED = 17, 1_000_003  # the web task's held-out tasks use TEST_SEED too


def pretraining_question(task) -> tuple[str, str]:
    """(question, attribute) the pre-training data asks on a fact/1 task.

    The task asks for the river of the capital; for about half the tasks the
    pre-training episode asks for the capital's founding year instead, so the
    model learns to read both lines of the page (and to confuse them).
    """
    rng = random.Random(f"web-task/fact/1/{task.seed}")
    country = rng.choice(task.world().countries)
    if rng.choice(["river", "founded"]) == "river":
        return task.instruction, "river"
    return f"In which year was the capital of {country.name} founded?", "founded"


def episode_texts(task, rng: random.Random, noisy: bool = True) -> list[str]:
    """[first observation, action, observation, action] of one (possibly mistaken) episode."""
    env = WebEnv(task)
    question, asked = pretraining_question(task)
    first = env.reset().replace(task.instruction, question)
    country = env.world.country(env._page().title)
    if noisy and rng.random() > P_CLICK:  # a value of the wrong page: one turn, wrong
        value = rng.choice([country.capital, country.population, country.language, country.currency])
        return [first, f"answer[{value}]"]
    click = env.resolve(task.plan[0])
    observation, _, _ = env.step(click)
    city = env.world.city(country.capital)
    attribute = (
        asked if (not noisy or rng.random() < P_ANSWER[asked]) else ({"river", "founded"} - {asked}).pop()
    )
    return [first, click, observation, f"answer[{getattr(city, attribute)}]"]


def tokenizer_corpus() -> list[str]:
    rng = random.Random(0)
    texts = ["user", "assistant", "system", "search[", "click[", "type[", "select[", "back", "answer["]
    for task in generate_tasks(600, seed=3):  # every family: any page tokenizes compactly
        env = WebEnv(task)
        actions = task.oracle_actions()
        first = env.reset()
        if task.kind == "fact/1":  # as the pre-training episodes ask it
            question, asked = pretraining_question(task)
            first = first.replace(task.instruction, question)
            actions[-1] = (
                f"answer[{getattr(env.world.city(env.world.country(env._page().title).capital), asked)}]"
            )
        texts.append(first)
        for action in actions:
            texts += [action, env.step(action)[0]]
    for task in generate_tasks(400, seed=4, difficulty=1, families=["fact"]):
        texts += episode_texts(task, rng)
    return texts


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(base.QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        min_frequency=2,
        special_tokens=base.SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    return tokenizer


def sft_example(tokenizer, texts: list[str]) -> tuple[list[int], list[float]]:
    """Token ids of the chat and a mask on targets: 1 where the next token is the model's."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]
    ids, owner = [], []
    for k in range(len(messages)):
        upto = list(tokenizer.apply_chat_template(messages[: k + 1], add_generation_prompt=(k % 2 == 0)))
        new = upto[len(ids) :]
        if k % 2 == 1:  # the assistant's content and its end token are learnt, not the newline after it
            end = new.index(tokenizer.eos_token_id) + 1
            ids += new[:end]
            owner += [1.0] * end
            continue
        ids += new
        owner += [0.0] * len(new)
    mask = owner[1:] + [0.0]
    return ids, mask


def batches(examples, batch_size: int, rng: random.Random, pad_id: int):
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            part = [examples[i] for i in order[start : start + batch_size]]
            width = max(len(ids) for ids, _ in part)
            ids = [x + [pad_id] * (width - len(x)) for x, _ in part]
            mask = [m + [0.0] * (width - len(m)) for _, m in part]
            yield mx.array(ids), mx.array(mask, dtype=mx.float32)


def success_rates(folder: Path, tasks, samples: int, seed: int) -> dict:
    """Greedy and sampled (T = 1) success of whole episodes, through the trainer's rollout code."""
    from mlx_grpo.models.loading import load_policy
    from mlx_grpo.sampling.multiturn import rollout_episodes
    from mlx_grpo.sampling.rollout import SamplingConfig

    model, tokenizer = load_policy(str(folder))
    out = {}
    for name, temperature, group in (("greedy", 0.0, 1), ("sampled", 1.0, samples)):
        mx.random.seed(seed)
        envs = [WebEnv(t) for t in tasks for _ in range(group)]
        episodes = rollout_episodes(
            model, tokenizer, envs, group, SamplingConfig(temperature, max_tokens=12), 3, 256
        )
        solved = [bool(ep.info.get("solved")) for ep in episodes]
        out[f"{name}_success"] = round(sum(solved) / len(solved), 4)
        out[f"{name}_reward"] = round(sum(ep.reward for ep in episodes) / len(episodes), 4)
        if name == "sampled":
            out[f"pass@{samples}"] = round(
                sum(any(solved[i : i + group]) for i in range(0, len(solved), group)) / len(tasks), 4
            )
        else:
            out["greedy_examples"] = [ep.text for ep in episodes[:3]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--examples", type=int, default=6000)
    parser.add_argument("--eval-tasks", type=int, default=32)
    parser.add_argument("--out", type=Path, default=TINY_WEB_MODEL)
    args = parser.parse_args()

    started = time.time()
    rng = random.Random(f"build-web/{args.seed}")
    mx.random.seed(args.seed)
    staging = args.out.with_name(args.out.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    hf_tokenizer = build_tokenizer()
    base.save_tokenizer(hf_tokenizer, staging)
    settings = json.loads((staging / "tokenizer_config.json").read_text())
    settings["model_max_length"] = 4096
    (staging / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    eos_id, pad_id = hf_tokenizer.token_to_id(base.IM_END), hf_tokenizer.token_to_id(base.PAD)
    config = base.model_config(hf_tokenizer.get_vocab_size(), eos_id)
    config["max_position_embeddings"] = 4096
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"tokenizer: {hf_tokenizer.get_vocab_size()} tokens")

    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(staging)
    model = base.make_model(config)
    mx.eval(model.parameters())
    tasks = generate_tasks(args.examples, seed=TRAIN_SEED, difficulty=1, families=["fact"])
    examples = [sft_example(tokenizer, episode_texts(t, rng)) for t in tasks]
    mean_len = sum(len(ids) for ids, _ in examples) / len(examples)
    print(
        f"model: {base.count_parameters(model):,} parameters; "
        f"data: {len(examples)} episodes, {mean_len:.0f} tokens each"
    )

    train_start = time.time()
    history = base.train(
        model,
        batches(examples, args.batch_size, rng, pad_id),
        args.steps,
        args.lr,
        max(1, args.steps // 20),
        log_every=50,
    )
    train_seconds = time.time() - train_start
    mx.save_safetensors(
        str(staging / "model.safetensors"), dict(tree_flatten(model.parameters())), metadata={"format": "mlx"}
    )

    test = generate_tasks(args.eval_tasks, seed=TEST_SEED, difficulty=1, families=["fact"])
    metrics = success_rates(staging, test, samples=8, seed=args.seed)
    print({k: v for k, v in metrics.items() if k != "greedy_examples"})
    info = {
        "seed": args.seed,
        "parameters": base.count_parameters(model),
        "config": config,
        "data": {
            "family": "fact/1",
            "episodes": len(examples),
            "mean_tokens": round(mean_len, 1),
            "p_click_right": P_CLICK,
            "p_answer_right": P_ANSWER,
        },
        "sft": {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "train_seconds": round(train_seconds, 1),
            "loss_history": history,
        },
        "eval": {
            "tasks": f"generate_tasks({args.eval_tasks}, seed={TEST_SEED}, difficulty=1, families=['fact'])",
            "max_turns": 3,
            "max_tokens": 12,
            **metrics,
        },
        "build_seconds": round(time.time() - started, 1),
    }
    (staging / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(args.out, ignore_errors=True)
    staging.rename(args.out)
    print(f"wrote {args.out} in {info['build_seconds']:.0f}s")


if __name__ == "__main__":
    main()
