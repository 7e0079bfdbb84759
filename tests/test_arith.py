"""The embedded "arith" task (rewards/arith.py) and the tiny model built for it."""

import json
from pathlib import Path

import pytest

from rewards import arith

MODEL_DIR = Path(__file__).resolve().parent.parent / "mlx_grpo" / "assets" / "tiny-arith"


# --- extract_answer -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3 + 4 = 7\n#### 7", "7"),
        ("#### 68", "68"),
        ("####68", "68"),
        ("####   12  ", "12"),
        ("#### 1,234", "1234"),
        ("#### -5", "-5"),
        ("#### - 5", "-5"),
        ("#### 2.50", "2.50"),
        ("#### 3\n#### 4", "4"),  # the last marker wins
        ("#### 9\nand then 12 more", "9"),  # a number after the answer line is ignored
        ("#### 9.", "9"),  # a full stop after the number is not a decimal point
        ("3 + 4 = 7", None),  # no marker
        ("", None),
        ("#### ", None),  # marker without a number
        ("#### 5\n#### seven", None),  # the last marker has no number
        ("#### x12", None),
        (None, None),
    ],
)
def test_extract_answer(text, expected):
    assert arith.extract_answer(text) == expected


# --- rewards ----------------------------------------------------------------------------


def test_correctness_reward_hand_worked():
    completions = [
        "5 + 3 = 8\n#### 8",  # right
        "5 - 3 = 2\n#### 2",  # wrong operation
        "5 + 3 = 8",  # no final line
        "#### 8.0",  # numerically equal
        "#### 1,000",  # commas removed
        "#### -4",
        "#### 8\nextra 9",  # the answer line counts, not the trailing number
    ]
    answers = ["8", "8", "8", "8", "1000", "-4", "8"]
    rewards = arith.correctness_reward(["q"] * len(completions), completions, answers)
    assert rewards == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def test_correctness_reward_accepts_chat_messages_and_extra_columns():
    completions = [[{"role": "assistant", "content": "2 * 3 = 6\n#### 6"}], {"content": "#### 7"}]
    rewards = arith.correctness_reward(None, completions, answer=["6", "6"], template=["x", "y"])
    assert rewards == [1.0, 0.0]


def test_correctness_reward_on_the_worked_solutions_is_one():
    problems = arith.generate_problems(50, seed=3, split="train")
    prompts = [p["prompt"] for p in problems]
    solutions = [p["solution"] for p in problems]
    answers = [p["answer"] for p in problems]
    assert arith.correctness_reward(prompts, solutions, answers) == [1.0] * 50


def test_format_reward():
    completions = ["5 + 3 = 8\n#### 8", "#### 8\n", "5 + 3 = 8", "#### 8 apples", "#### 8\nmore text", ""]
    assert arith.format_reward(None, completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


# --- problems ---------------------------------------------------------------------------


def test_problem_fields_and_answers_are_consistent():
    for problem in arith.generate_problems(100, seed=1, split="test"):
        assert problem["solution"].endswith(f"#### {problem['answer']}")
        assert arith.extract_answer(problem["solution"]) == problem["answer"]
        assert int(problem["answer"]) > 0
        assert problem["template"] in arith.TEMPLATES
        assert "<|im_start|>" not in problem["prompt"]


def test_generate_problems_is_deterministic():
    assert arith.generate_problems(30, seed=7) == arith.generate_problems(30, seed=7)
    assert arith.generate_problems(30, seed=7) != arith.generate_problems(30, seed=8)
    # A shorter list is a prefix of a longer one with the same seed.
    assert (
        arith.generate_problems(10, seed=7, split="test")
        == arith.generate_problems(20, seed=7, split="test")[:10]
    )


def test_train_and_test_do_not_overlap():
    test = {p["prompt"] for p in arith.generate_problems(500, seed=0, split="test")}
    assert len(test) == 500  # test problems are distinct
    for seed in (0, 1):
        train = {p["prompt"] for p in arith.generate_problems(3000, seed=seed, split="train")}
        assert not train & test
    assert all(arith.split_of(p) == "test" for p in test)


def test_all_templates_appear():
    templates = {p["template"] for p in arith.generate_problems(200, seed=0, split="test")}
    assert templates == set(arith.TEMPLATES)


def test_generate_problems_rejects_bad_split():
    with pytest.raises(ValueError):
        arith.generate_problems(3, seed=0, split="validation")


# --- the embedded model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded():
    mlx_lm = pytest.importorskip("mlx_lm")
    if not (MODEL_DIR / "model.safetensors").exists():
        pytest.skip("tiny-arith model not built (python scripts/build_tiny_model.py)")
    return mlx_lm.load(str(MODEL_DIR))


def test_embedded_model_config():
    if not (MODEL_DIR / "build_info.json").exists():
        pytest.skip("tiny-arith model not built (python scripts/build_tiny_model.py)")
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    info = json.loads((MODEL_DIR / "build_info.json").read_text())
    assert 100_000 < info["parameters"] < 1_000_000


def test_embedded_model_loads_and_tokenizer_round_trips(embedded):
    import mlx.core as mx

    model, tokenizer = embedded
    problem = arith.generate_problems(1, seed=0, split="test")[0]
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": problem["prompt"]}], add_generation_prompt=True
    )
    text = tokenizer.decode(ids)
    assert text == f"<|im_start|>user\n{problem['prompt']}<|im_end|>\n<|im_start|>assistant\n"

    solution_ids = tokenizer.encode(problem["solution"], add_special_tokens=False)
    assert tokenizer.decode(solution_ids) == problem["solution"]
    # Every digit is its own token.
    digits = [t for t in tokenizer.convert_ids_to_tokens(solution_ids) if any(c.isdigit() for c in t)]
    assert all(len(t) == 1 for t in digits)

    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id in tokenizer.eos_token_ids

    logits = model(mx.array([ids]))
    assert logits.shape == (1, len(ids), model.args.vocab_size)


def test_embedded_tokenizer_json_matches_the_loaded_tokenizer(embedded):
    """tokenizer.json alone (what transformers 4 loads) gives the ids the model was trained on."""
    from tokenizers import Tokenizer

    _, tokenizer = embedded
    raw = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    for problem in arith.generate_problems(20, seed=0, split="test"):
        chat = f"<|im_start|>user\n{problem['prompt']}<|im_end|>\n<|im_start|>assistant\n"
        for text in (chat, problem["solution"]):
            assert raw.encode(text, add_special_tokens=False).ids == tokenizer.encode(
                text, add_special_tokens=False
            )
