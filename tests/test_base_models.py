"""Base models (no chat template): a plain-text prompt frame and stop strings that end the answer."""

import json
import shutil

import pytest

from mlx_grpo.config import ConfigError, build_config
from mlx_grpo.models.loading import load_policy
from mlx_grpo.sampling.rollout import SamplingConfig, sample_completions
from mlx_grpo.tasks.data import DataError, encode_prompt, stop_token_ids, task_prompts, use_stop_strings
from mlx_grpo.run.task_setup import load_task
from mlx_grpo.tasks.registry import is_base_model, is_chat_model, recommended_settings


@pytest.fixture(scope="module")
def base_model_path(tiny_model_path, tmp_path_factory):
    """The tiny model with its chat template taken out: a base model, as far as files tell."""
    folder = tmp_path_factory.mktemp("base") / "tiny-base"
    shutil.copytree(tiny_model_path, folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("chat_template", None)
    config_file.write_text(json.dumps(config))
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    return folder


def test_a_model_without_a_chat_template_is_a_base_model(base_model_path, tiny_model_path):
    assert is_chat_model(str(base_model_path)) and is_base_model(str(base_model_path))
    assert not is_base_model(None)  # the embedded model has its own task variant


def test_arith_recommends_a_frame_and_a_newline_stop_to_a_base_model(base_model_path):
    settings = recommended_settings("arith", str(base_model_path))
    assert "{prompt}" in settings["prompt_format"] and settings["stop"] == ["\n"]
    config = build_config({"model": str(base_model_path)}, task_defaults=recommended_settings)
    task = load_task(config)
    assert task.prompt_format == settings["prompt_format"] and task.stop == ["\n"]
    assert not task.system_prompt  # no instructions: the worked examples show the form


def test_the_frame_wraps_the_prompt_in_plain_text(base_model_path):
    _, tokenizer = load_policy(str(base_model_path))
    assert not getattr(tokenizer, "chat_template", None)
    frame = "Q: 1+1?\nA: 2\n\nQ: {prompt}\nA:"
    ids = encode_prompt(tokenizer, "3+4?", None, frame)
    assert tokenizer.decode(ids) == "Q: 1+1?\nA: 2\n\nQ: 3+4?\nA:"
    assert tokenizer.decode(encode_prompt(tokenizer, "{x}", "Be brief.", frame)).startswith(
        "Be brief.\n\nQ: 1+1?"
    )


def test_stop_tokens_are_the_tokens_whose_text_starts_with_a_stop_string(base_model_path):
    _, tokenizer = load_policy(str(base_model_path))
    texts = {i: tokenizer.decode([i]) for i in range(len(tokenizer._tokenizer))}
    expected = {i for i, t in texts.items() if t[:1] == "\n"}
    assert expected and stop_token_ids(tokenizer, ["\n"]) == expected
    with pytest.raises(DataError, match="no token of this tokenizer starts with"):
        use_stop_strings(tokenizer, ["\u2603\u2603 never a token"])


def test_completions_end_at_the_first_stop_token(base_model_path):
    model, tokenizer = load_policy(str(base_model_path))
    task = type("T", (), {"stop": ["\n", "."], "system_prompt": None, "prompt_format": "{prompt}"})()
    prompts = task_prompts(tokenizer, task, [{"prompt": "Tom has 3 apples"}, {"prompt": "x"}])
    completions = sample_completions(
        model, tokenizer, prompts, 16, SamplingConfig(temperature=1.5, max_tokens=24), seed=3
    )
    stops = stop_token_ids(tokenizer, ["\n", "."])
    stopped = [c for c in completions if c.finish_reason == "stop"]
    assert stopped, "a random tiny model at T 1.5 must hit a newline or a full stop within 24 tokens"
    for c in completions:
        body = c.tokens[:-1] if c.finish_reason == "stop" else c.tokens
        assert not stops & set(body)  # nothing after the first stop token was sampled
        assert c.finish_reason == "length" or c.tokens[-1] in stops | set(tokenizer.eos_token_ids)
        assert c.text == tokenizer.decode(body)


def test_bad_frames_and_stops_are_config_errors():
    with pytest.raises(ConfigError, match="prompt_format must contain {prompt}"):
        build_config({"prompt_format": "Question: nothing here"})
    with pytest.raises(ConfigError, match="stop strings must be non-empty"):
        build_config({"stop": [""]})
    assert build_config({"stop": "\\n"}).stop == ["\n"]  # typed on a command line
