"""Build the tiny tool model: rewards/multihop/assets/tiny-tools/.

    python scripts/build_tiny_tool_model.py [--seed 0] [--steps N]

A byte-level BPE tokenizer learnt from the multihop task's own episodes (the
prompt, questions, paragraphs, calls; every name one token), and a tiny Qwen2
model (mlx-lm's qwen2) pre-trained by supervised learning on whole 2-hop tool
episodes of one chain, "In which country is COMPANY based?", rendered exactly
as `mlx-grpo train --task multihop` renders them (rewards/multihop/training.py's
MultihopEnv, through the model's own compact tools template): read the company,
read the city it is based in, answer the city's country. The loss covers the
model's turns only. Only that chain (`multihop_chains: [city/country]`, as the
web model keeps to fact/1): its every copy is one name of a kind the model can
pick out, where a person's two-word name would need an induction circuit that
a model this small does not form in minutes of pre-training.

Like the arithmetic and web models, the episodes are deliberately imperfect,
to leave reinforcement learning a way up: with probability 1 - P_CALL the
model answers at once with the question's own company (always wrong), and
otherwise, having read both paragraphs, it answers the city instead of its
country with probability 1 - P_RIGHT. Greedy, it answers at once: reinforcement
learning has to teach it both to look things up and which name to give.
Status (2026-11-25): not yet shipped. Built at these defaults on the loaded 2-core CPU
(16 min), the copies inside calls are learnt (teacher-forced on 64 held-out right episodes,
p(right name) 0.998 for the company, 0.996 for the city), but the final answer is not: after
reading the city's paragraph the model names one fixed country (54 of 64) instead of copying
it (p 0.06), so sampled accuracy is 0.02 and there is too little for GRPO to climb. Before the
two phases (loss on the model's turns only, 600 steps) no copy was learnt at all (0.11 greedy).
Phase 2 with the loss on every token at lr/4 did not help the answer either (p 0.058; one
fixed country 42 times, the city 14). Next: find why the answer's copy fails where the calls'
copies succeed, with teacher-forced p(right name) per turn, before any RL run.

The script ends by measuring greedy and sampled (T = 1) accuracy on held-out
questions through the trainer's own rollout, and writes build_info.json.
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
from build_tiny_web_model import batches  # noqa: E402

from rewards.multihop.answers import exact_match_reward  # noqa: E402
from rewards.multihop.tiny_model import TINY_TOOL_MODEL  # noqa: E402
from rewards.multihop.training import SYSTEM_PROMPT, MultihopEnv, synthetic_rows  # noqa: E402

CHAINS = ["city/country"]  # "In which country is Vozelri based?": read the company, read its city, answer
P_CALL = 0.4  # reads the question's company first; otherwise answers at once with the company's own name
P_RIGHT = 0.45  # then reads the city it is based in and answers its country; otherwise answers the city
MAX_TOKENS, MAX_TURNS, MAX_EPISODE_TOKENS = 32, 4, 320


def call(title: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "read", "arguments": {"title": title}}) + "\n</tool_call>"


def model_turns(row: dict, rng: random.Random, noisy: bool = True) -> list[str]:
    """The model's turns of one (possibly mistaken) city/country episode on a synthetic row."""
    steps = row["question_decomposition"]
    company = next(p["title"] for p in row["paragraphs"] if p["idx"] == steps[0]["paragraph_support_idx"])
    city = steps[0]["answer"]
    if noisy and rng.random() > P_CALL:
        return [company]  # answers without looking anything up: the question's own company
    # Having read both paragraphs, it names the country or (wrongly) the city: both are copies from
    # the city's paragraph ("Facy is a city in Pabangi"), so which one is a choice at one token.
    answer = row["answer"] if not noisy or rng.random() < P_RIGHT else city
    return [call(company), call(city), answer]


def episode_ids(tokenizer, join, row: dict, turns: list[str]) -> tuple[list[int], list[float]]:
    """Token ids of the episode as the rollout builds them, and the mask of the model's next tokens."""
    env = MultihopEnv(row, [exact_match_reward], [1.0], SYSTEM_PROMPT, 5.0)
    env.bind(tokenizer)
    ids = list(tokenizer.encode(env.reset(), add_special_tokens=False))
    owner = [0.0] * len(ids)
    for turn in turns:
        new = list(tokenizer.encode(turn, add_special_tokens=False)) + [tokenizer.eos_token_id]
        ids += new
        owner += [1.0] * len(new)
        observation, done, _ = env.step(turn)
        if done:
            break
        joined = list(tokenizer.encode(join.text(observation, True), add_special_tokens=False))
        ids += joined
        owner += [0.0] * len(joined)
    return ids, owner[1:] + [0.0]


def episode_texts(tokenizer, row: dict, turns: list[str]) -> list[str]:
    env = MultihopEnv(row, [exact_match_reward], [1.0], SYSTEM_PROMPT, 5.0)
    env.bind(tokenizer)
    texts = [str(env.reset())]
    for turn in turns:
        observation, done, _ = env.step(turn)
        texts += [turn, str(observation)]
        if done:
            break
    return texts


def build_tokenizer(texts: list[str]):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(base.QWEN2_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1600, min_frequency=2, special_tokens=base.SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # Every word once more on a line of its own, where no space precedes it: the merges that make it one
    # token are then learnt even for words that always follow a space (most names), which the merges
    # without_space_merges drops would otherwise have been the only ones to join.
    words = sorted({w for text in texts for w in text.split()})
    tokenizer.train_from_iterator([*texts, *words], trainer=trainer)
    return without_space_merges(tokenizer)


def without_space_merges(tokenizer):
    """The tokenizer with every merge of a space into a word taken out: a word is then the same
    token everywhere. Qwen2's split gives a name its leading space in running text (" Kazel")
    but not after a quote or at the start of a turn ('{"title": "Kazel"}', the answer), and a
    model this small never learns that the two are one name; copied whole, it only has to find it."""
    from tokenizers import Tokenizer

    state = json.loads(tokenizer.to_str())
    merges = state["model"]["merges"]
    pairs = [m.split(" ") if isinstance(m, str) else m for m in merges]
    state["model"]["merges"] = [m for m, (a, b) in zip(merges, pairs)
                                if not (a + b).startswith("Ġ") or set(a + b) == {"Ġ"}]
    return Tokenizer.from_str(json.dumps(state))


# The model's own chat template knows tools (as Qwen2.5's does), in a compact form: the system
# turn names each tool and its arguments on one line instead of the JSON schemas, calls are
# Hermes-style <tool_call> blocks, results come back as user turns of <tool_response>. A prompt
# is then about 40 tokens, not the fallback's 450, which a model of half a million parameters
# needs to find the name to copy.
TOOL_TEMPLATE = (
    "{%- if tools -%}{{ '<|im_start|>system\\nTools:' }}"
    "{%- for tool in tools %} {{ tool.function.name }}({{ tool.function.parameters.properties | list | join(', ') }})"
    "{%- endfor %}{{ '.' }}"
    "{%- if messages[0].role == 'system' and messages[0].content %} {{ messages[0].content }}{%- endif %}"
    "{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}{%- if not tools -%}"
    "{{ '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- elif message.role == 'tool' -%}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' and message.tool_calls -%}"
    "{{ '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls -%}"
    "{{ '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' + (call.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor -%}{{ '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def write_tokenizer(hf_tokenizer, folder: Path):
    from mlx_lm.utils import load_tokenizer

    base.save_tokenizer(hf_tokenizer, folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["model_max_length"] = 4096
    settings["chat_template"] = TOOL_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return load_tokenizer(folder)


def accuracy(folder: Path, rows: list[dict], samples: int, seed: int) -> dict:
    """Greedy and sampled (T = 1) exact match of whole episodes, through the trainer's rollout code."""
    from mlx_grpo.models.loading import load_policy
    from mlx_grpo.sampling.multiturn import rollout_episodes
    from mlx_grpo.sampling.rollout import SamplingConfig

    model, tokenizer = load_policy(str(folder))
    out = {}
    for name, temperature, group in (("greedy", 0.0, 1), ("sampled", 1.0, samples)):
        envs = [MultihopEnv(r, [exact_match_reward], [1.0], SYSTEM_PROMPT, 5.0) for r in rows for _ in range(group)]
        episodes = rollout_episodes(model, tokenizer, envs, group, SamplingConfig(temperature, max_tokens=MAX_TOKENS),
                                    MAX_TURNS, MAX_EPISODE_TOKENS, seed=seed)
        solved = [bool(ep.info.get("solved")) for ep in episodes]
        out[f"{name}_accuracy"] = round(sum(solved) / len(solved), 4)
        out[f"{name}_calls"] = round(sum(ep.info.get("tools/calls", 0) for ep in episodes) / len(episodes), 3)
        if name == "sampled":
            out[f"pass@{samples}"] = round(sum(any(solved[i:i + group]) for i in range(0, len(solved), group))
                                           / len(rows), 4)
        else:
            out["greedy_examples"] = [ep.text for ep in episodes[:3]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--copy-steps", type=int, default=400, help="phase 1: right episodes, every token")
    parser.add_argument("--steps", type=int, default=150, help="phase 2: the imperfect episodes")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--eval-rows", type=int, default=64)
    parser.add_argument("--out", type=Path, default=TINY_TOOL_MODEL)
    args = parser.parse_args()
    from mlx_grpo.blas import use_openblas

    use_openblas()  # re-executes the script with OpenBLAS preloaded, when there is one

    started = time.time()
    rng = random.Random(f"build-tools/{args.seed}")
    mx.random.seed(args.seed)
    staging = args.out.with_name(args.out.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    # Rendering needs only the chat template: a first tokenizer renders the corpus the real one is learnt from.
    rows = synthetic_rows("train", [2], args.examples, seed=10_000 + args.seed, chains=CHAINS)  # worlds no run trains or tests on
    turns = [model_turns(r, rng) for r in rows]
    bootstrap = write_tokenizer(build_tokenizer(["user", "assistant"]), staging)
    corpus = [t for r, ts in zip(rows[:1500], turns) for t in episode_texts(bootstrap, r, ts)]
    corpus += [t for r in rows[1500:2500] for t in episode_texts(bootstrap, r, model_turns(r, rng, noisy=False))]
    hf_tokenizer = build_tokenizer(corpus)
    tokenizer = write_tokenizer(hf_tokenizer, staging)
    eos_id, pad_id = hf_tokenizer.token_to_id(base.IM_END), hf_tokenizer.token_to_id(base.PAD)
    config = base.model_config(hf_tokenizer.get_vocab_size(), eos_id, hidden=args.hidden, layers=args.layers,
                               intermediate=4 * args.hidden, heads=args.heads, kv_heads=args.heads)
    config["max_position_embeddings"] = 4096
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"tokenizer: {hf_tokenizer.get_vocab_size()} tokens")

    from mlx_grpo.sampling.multiturn import chat_join

    join = chat_join(tokenizer)
    model = base.make_model(config)
    mx.eval(model.parameters())
    examples = [episode_ids(tokenizer, join, r, ts) for r, ts in zip(rows, turns)]
    mean_len = sum(len(ids) for ids, _ in examples) / len(examples)
    print(f"model: {base.count_parameters(model):,} parameters; data: {len(examples)} episodes, "
          f"{mean_len:.0f} tokens each")

    # Phase 1 teaches the copies: right episodes only, with the loss on every token. The paragraphs
    # then copy too (a read's result opens with the title asked for), and the model learns to
    # copy a name in a few hundred steps; with the loss on its own turns alone, and half its
    # episodes answering at once, it had not learnt to in 600. Phase 2 sets the imperfect choices
    # (P_CALL, P_RIGHT) on the model's own turns, as the rollout will train them.
    train_start = time.time()
    right = [episode_ids(tokenizer, join, r, model_turns(r, rng, noisy=False)) for r in rows]
    right = [(ids, [1.0] * (len(ids) - 1) + [0.0]) for ids, _ in right]
    history = base.train(model, batches(right, args.batch_size, rng, pad_id), args.copy_steps, args.lr,
                         max(1, args.copy_steps // 20), log_every=50)
    history += base.train(model, batches(examples, args.batch_size, rng, pad_id), args.steps, args.lr / 2,
                          max(1, args.steps // 10), log_every=50)
    train_seconds = time.time() - train_start
    mx.save_safetensors(str(staging / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})

    test = synthetic_rows("test", [2], args.eval_rows, seed=0, chains=CHAINS)  # the task's own held-out questions
    metrics = accuracy(staging, test, samples=8, seed=args.seed)
    print({k: v for k, v in metrics.items() if k != "greedy_examples"})
    info = {
        "seed": args.seed, "parameters": base.count_parameters(model), "config": config,
        "data": {"hops": 2, "chains": CHAINS, "episodes": len(examples), "mean_tokens": round(mean_len, 1), "p_call": P_CALL,
                 "p_right": P_RIGHT},
        "sft": {"copy_steps": args.copy_steps, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
                "train_seconds": round(train_seconds, 1), "loss_history": history},
        "eval": {"rows": f"synthetic_rows('test', [2], {args.eval_rows}, seed=0, chains={CHAINS})", "max_turns": MAX_TURNS,
                 "max_tokens": MAX_TOKENS, **metrics},
        "build_seconds": round(time.time() - started, 1),
    }
    (staging / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(args.out, ignore_errors=True)
    staging.rename(args.out)
    print(f"wrote {args.out} in {info['build_seconds']:.0f}s")


if __name__ == "__main__":
    main()
