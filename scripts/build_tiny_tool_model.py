"""Build the tiny tool model: rewards/multihop/assets/tiny-tools/.

    python scripts/build_tiny_tool_model.py [--seed 1] [--copy-steps N] [--steps N]

A byte-level BPE tokenizer learnt from the multihop task's own episodes (the
prompt, questions, paragraphs, calls; every name one token), and a tiny Qwen2
model (mlx-lm's qwen2) pre-trained by supervised learning on whole 2-hop tool
episodes of one chain, "In which country is COMPANY based?", rendered exactly
as `mlx-grpo train --task multihop` renders them (rewards/multihop/training.py's
MultihopEnv, through the model's own compact tools template): read the company,
read the city it is based in, answer the city's country (phase 1 below adds
3-hop practice episodes that read the country too). Only that chain (`multihop_chains: [city/country]`, as the
web model keeps to fact/1): its every copy is one name of a kind the model can
pick out, where a person's two-word name would need an induction circuit that
a model this small does not form in minutes of pre-training.

Like the arithmetic and web models, the episodes are deliberately imperfect,
to leave reinforcement learning a way up, and every mistake is a choice at a
turn's first token: with probability 1 - P_CALL the model answers at once with
the question's own company, and having read the company, with probability
1 - P_READ_ON it answers the company's city instead of reading on. Answers are
written in double quotes, "NAME". Greedy, it answers at once: reinforcement learning has
to teach it to keep looking things up.

Two phases. Phase 1 trains on right episodes with the loss on every token (the
paragraphs copy the titles asked for, which teaches copying), in rounds of
--copy-steps until a teacher-forced probe on unseen worlds (copy_probe) gives
the right name p > 0.9 at all three copies; phase 2 sets the choices on the
model's own turns.

Built at the defaults (seed 1) in 12 min on the 2-core CPU. The
teacher-forced probe after phase 1 gave p 0.995 / 0.988 / 0.98 (company, city, country), after
phase 2 0.999 / 0.996 / 0.996; greedy accuracy 0 (it answers at once), sampled 0.20, pass@8 0.84.
`mlx-grpo train --task multihop` then went 0.00 -> 1.00 on 64 held-out questions in 1 min 47 s,
and `compare --n 200` 0.000 -> 1.000 (McNemar p 1.2e-60). What it took, measured with the probe:
- The copies inside calls are learnt by every run in 200-400 steps. The country's copy into the
  answer is a sudden transition that, answered bare or as "Answer: NAME", only 1 run in 4 made
  (the others sat at chance, p 0.125 over 8 country names, to step 800).
- Two changes each made a failing initialisation learn it: 3-hop practice episodes, where the
  country is also copied into a call (0.30 -> 1.00 answer exact at step 300), and the answer in
  double quotes, where a call's title copy starts (0.08 -> 0.86 at step 400). Both are kept.
- A position where two names compete (the city or its country after both reads) taught neither:
  the model named one fixed country. Every mistake is now a choice of call or answer.

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
from tiny_tool_tokenizer import build_tokenizer, write_tokenizer  # noqa: E402 (BPE and the tools template)

from rewards.multihop.answers import exact_match_reward  # noqa: E402
from rewards.multihop.tiny_model import TINY_TOOL_MODEL  # noqa: E402
from rewards.multihop.training import SYSTEM_PROMPT, MultihopEnv, synthetic_rows  # noqa: E402

CHAINS = ["city/country"]  # "In which country is Vozelri based?": read the company, read its city, answer
P_CALL = 0.45  # reads the question's company first; otherwise answers at once with the company's own name
P_READ_ON = 0.45  # having read it, reads the city it is based in; otherwise answers that city (wrong)
MAX_TOKENS, MAX_TURNS, MAX_EPISODE_TOKENS = 32, 4, 320


def call(title: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "read", "arguments": {"title": title}}) + "\n</tool_call>"


def model_turns(row: dict, rng: random.Random, noisy: bool = True) -> list[str]:
    """The model's turns of one (possibly mistaken) city/country episode on a synthetic row.

    Every mistake is a choice at a turn's first token, between calling and answering: the name that
    follows is always the one a copy finds (the question's company, the last name of the paragraph
    just read). A position where two names compete (the city or its country after both reads, as
    first built) taught the model neither: it fell back on one fixed country."""
    company, city = question_company(row), row["question_decomposition"][0]["answer"]
    if noisy and rng.random() > P_CALL:
        return [answer(company)]  # answers without looking anything up: the question's own company
    if noisy and rng.random() > P_READ_ON:
        return [call(company), answer(city)]  # stops after one hop: the city is not the country asked for
    return [call(company), call(city), answer(row["answer"])]


def question_company(row: dict) -> str:
    """The company the question names: the title of the first hop's supporting paragraph."""
    first_hop = row["question_decomposition"][0]["paragraph_support_idx"]
    return next(p["title"] for p in row["paragraphs"] if p["idx"] == first_hop)


def answer(name: str) -> str:
    """An answer turn: the name in double quotes, "Pabangi" (the scorer drops the quotes as punctuation).
    The opening quote is where a call copies its title ('"title": "Facy'), so the answer's copy starts
    from the calls' own: answered bare, at the turn's first token where the model also decides whether
    to call, the country's copy was not learnt (one fixed country), nor after "Answer: " in 3 of 4 runs."""
    return json.dumps(name)


PRACTICE_CHAIN = ["city/country/language"]  # reads the country too: its name copied into a call


def practice_turns(row: dict) -> list[str]:
    """A right 3-hop episode, "What language is spoken in the country where COMPANY is based?": read the
    company, its city, the city's country, answer the language. Phase 1 only. A country occurs once in a
    2-hop episode and its copy into the answer was learnt only by lucky initialisations (1 run in 4);
    copied into a call here as well, it was learnt by one of those that had missed it (step 300)."""
    steps = row["question_decomposition"]
    return [
        call(question_company(row)),
        call(steps[0]["answer"]),
        call(steps[1]["answer"]),
        answer(row["answer"]),
    ]


def copy_probe(model, tokenizer, join, rows: list[dict]) -> list[float]:
    """Teacher-forced on right episodes: the mean probability of the right name at each of the three
    copies (the company in the first call, the city in the second, the country in the answer)."""
    import numpy as np

    found = [[], [], []]
    for row in rows:
        turns = model_turns(row, random.Random(0), noisy=False)
        ids, owner = episode_ids(tokenizer, join, row, turns)
        probs = np.array(mx.softmax(model(mx.array([ids[:-1]]))[0], axis=-1))
        starts = [t for t in range(len(owner)) if owner[t] and (t == 0 or not owner[t - 1])]
        names = [question_company(row), row["question_decomposition"][0]["answer"], row["answer"]]
        for k, (start, name) in enumerate(zip(starts, names)):
            first = tokenizer.encode(name, add_special_tokens=False)[0]
            t = next(t for t in range(start, len(owner)) if ids[t + 1] == first)
            found[k].append(float(probs[t, first]))
    return [round(sum(f) / len(f), 3) for f in found]


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


def accuracy(folder: Path, rows: list[dict], samples: int, seed: int) -> dict:
    """Greedy and sampled (T = 1) exact match of whole episodes, through the trainer's rollout code."""
    from mlx_grpo.models.loading import load_policy
    from mlx_grpo.sampling.multiturn import rollout_episodes
    from mlx_grpo.sampling.rollout import SamplingConfig

    model, tokenizer = load_policy(str(folder))
    out = {}
    for name, temperature, group in (("greedy", 0.0, 1), ("sampled", 1.0, samples)):
        envs = [
            MultihopEnv(r, [exact_match_reward], [1.0], SYSTEM_PROMPT, 5.0)
            for r in rows
            for _ in range(group)
        ]
        episodes = rollout_episodes(
            model,
            tokenizer,
            envs,
            group,
            SamplingConfig(temperature, max_tokens=MAX_TOKENS),
            MAX_TURNS,
            MAX_EPISODE_TOKENS,
            seed=seed,
        )
        solved = [bool(ep.info.get("solved")) for ep in episodes]
        out[f"{name}_accuracy"] = round(sum(solved) / len(solved), 4)
        out[f"{name}_calls"] = round(sum(ep.info.get("tools/calls", 0) for ep in episodes) / len(episodes), 3)
        if name == "sampled":
            out[f"pass@{samples}"] = round(
                sum(any(solved[i : i + group]) for i in range(0, len(solved), group)) / len(rows), 4
            )
        else:
            out["greedy_examples"] = [ep.text for ep in episodes[:3]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--copy-steps", type=int, default=400, help="phase 1: right episodes, every token, a round"
    )
    parser.add_argument("--copy-rounds", type=int, default=3, help="phase 1: at most this many rounds")
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

    # Rendering needs only the chat template: a first tokenizer renders the corpus the real one is learnt
    # from.
    rows = synthetic_rows(
        "train", [2], args.examples, seed=10_000 + args.seed, chains=CHAINS
    )  # worlds no run trains or tests on
    turns = [model_turns(r, rng) for r in rows]
    bootstrap = write_tokenizer(build_tokenizer(["user", "assistant"]), staging)
    corpus = [t for r, ts in zip(rows[:1500], turns) for t in episode_texts(bootstrap, r, ts)]
    corpus += [
        t for r in rows[1500:2500] for t in episode_texts(bootstrap, r, model_turns(r, rng, noisy=False))
    ]
    practice = synthetic_rows("train", [3], args.examples, seed=30_000 + args.seed, chains=PRACTICE_CHAIN)
    corpus += [t for r in practice[:1000] for t in episode_texts(bootstrap, r, practice_turns(r))]
    hf_tokenizer = build_tokenizer(corpus)
    tokenizer = write_tokenizer(hf_tokenizer, staging)
    eos_id, pad_id = hf_tokenizer.token_to_id(base.IM_END), hf_tokenizer.token_to_id(base.PAD)
    config = base.model_config(
        hf_tokenizer.get_vocab_size(),
        eos_id,
        hidden=args.hidden,
        layers=args.layers,
        intermediate=4 * args.hidden,
        heads=args.heads,
        kv_heads=args.heads,
    )
    config["max_position_embeddings"] = 4096
    (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"tokenizer: {hf_tokenizer.get_vocab_size()} tokens")

    from mlx_grpo.sampling.multiturn import chat_join

    join = chat_join(tokenizer)
    model = base.make_model(config)
    mx.eval(model.parameters())
    examples = [episode_ids(tokenizer, join, r, ts) for r, ts in zip(rows, turns)]
    mean_len = sum(len(ids) for ids, _ in examples) / len(examples)
    print(
        f"model: {base.count_parameters(model):,} parameters; data: {len(examples)} episodes, "
        f"{mean_len:.0f} tokens each"
    )

    # Phase 1 teaches the copies: right episodes only (the 2-hop ones and the 3-hop practice), with the
    # loss on every token. The paragraphs then copy too (a read's result opens with the title asked
    # for), and the model learns to copy a name in a few hundred steps; with the loss on its own turns
    # alone, and half its episodes answering at once, it had not learnt to in 600. Phase 2 sets the
    # imperfect choices (P_CALL, P_READ_ON) on the model's own 2-hop turns, as the rollout will train them.
    train_start = time.time()
    right = [episode_ids(tokenizer, join, r, model_turns(r, rng, noisy=False)) for r in rows]
    right += [episode_ids(tokenizer, join, r, practice_turns(r)) for r in practice]
    right = [(ids, [1.0] * (len(ids) - 1) + [0.0]) for ids, _ in right]
    probe_rows = synthetic_rows("train", [2], 64, seed=20_000 + args.seed, chains=CHAINS)  # unseen worlds
    right_batches = batches(right, args.batch_size, rng, pad_id)
    history, probes = [], {}
    # The copies are learnt suddenly, after a plateau whose length depends on the initialisation (one
    # seed had all three at step 200, another still missed the answer's at 400 with the lr decayed):
    # train in rounds, each with its own warmup and decay, until the probe shows all three.
    for round_ in range(args.copy_rounds):
        history += base.train(
            model, right_batches, args.copy_steps, args.lr, max(1, args.copy_steps // 20), log_every=50
        )
        probes["after_copy_phase"] = copy_probe(model, tokenizer, join, probe_rows)
        print(f"p(right company, city, country), teacher-forced: {probes['after_copy_phase']}", flush=True)
        if min(probes["after_copy_phase"]) > 0.9:
            break
    else:
        raise SystemExit(
            f"the copies were not learnt in {args.copy_rounds} rounds "
            f"(p {probes['after_copy_phase']}): try another --seed"
        )
    probes["copy_rounds"] = round_ + 1
    history += base.train(
        model,
        batches(examples, args.batch_size, rng, pad_id),
        args.steps,
        args.lr / 2,
        max(1, args.steps // 10),
        log_every=50,
    )
    probes["after_choice_phase"] = copy_probe(model, tokenizer, join, probe_rows)
    print(f"p(right company, city, country), teacher-forced: {probes['after_choice_phase']}", flush=True)
    train_seconds = time.time() - train_start
    mx.save_safetensors(
        str(staging / "model.safetensors"), dict(tree_flatten(model.parameters())), metadata={"format": "mlx"}
    )

    test = synthetic_rows(
        "test", [2], args.eval_rows, seed=0, chains=CHAINS
    )  # the task's own held-out questions
    metrics = accuracy(staging, test, samples=8, seed=args.seed)
    print({k: v for k, v in metrics.items() if k != "greedy_examples"})
    info = {
        "seed": args.seed,
        "parameters": base.count_parameters(model),
        "config": config,
        "data": {
            "hops": 2,
            "chains": CHAINS,
            "episodes": len(examples),
            "mean_tokens": round(mean_len, 1),
            "p_call": P_CALL,
            "p_read_on": P_READ_ON,
        },
        "sft": {
            "copy_steps": args.copy_steps,
            "steps": args.steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "train_seconds": round(train_seconds, 1),
            "loss_history": history,
            "copy_probe": probes,
        },
        "eval": {
            "rows": f"synthetic_rows('test', [2], {args.eval_rows}, seed=0, chains={CHAINS})",
            "max_turns": MAX_TURNS,
            "max_tokens": MAX_TOKENS,
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
