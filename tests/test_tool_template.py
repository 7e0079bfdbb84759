"""Tools through the model's template or the fallback; what is inserted between turns is a clean difference."""

import json

import pytest

from mlx_grpo.models.loading import load_policy
from mlx_grpo.tools import parse_calls, schema_of
from mlx_grpo.tools.template import (ToolTemplateError, assistant_message, inserted_text, render, result_messages,
                                     template_supports_tools)

# A small tools-aware template written for this test, in the shape Qwen2.5's takes:
# schemas in the system turn, calls as <tool_call> JSON (arguments through tojson), results as <tool_response>.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls %}\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def search(query: str) -> str:
    """Search the notes.

    Args:
        query: words to look for
    """
    return query


@pytest.fixture()
def tokenizer(tiny_model_path):
    return load_policy(str(tiny_model_path))[1]


def test_a_template_without_tools_gets_the_fallback(tokenizer):
    assert not template_supports_tools(tokenizer)
    schemas = [schema_of(search)]
    text = render(tokenizer, [{"role": "user", "content": "Where is Oslo?"}], schemas, add_generation_prompt=True)
    assert '"name": "search"' in text and "<tool_call>" in text and text.endswith("assistant\n")
    turn = '<tool_call>\n{"name": "search", "arguments": {"query": "Oslo"}}\n</tool_call>'
    calls = parse_calls(turn, "hermes")
    history = [{"role": "user", "content": "Where is Oslo?"}, assistant_message(turn, calls, native=False)]
    added = inserted_text(tokenizer, history, result_messages(calls, ["Oslo is in Norway."], native=False), schemas)
    assert added == ("<|im_start|>user\n<tool_response>\nOslo is in Norway.\n</tool_response><|im_end|>\n"
                     "<|im_start|>assistant\n")


def test_a_tools_aware_template_renders_calls_and_results_natively(tokenizer):
    tokenizer.chat_template = TOOLS_TEMPLATE
    assert template_supports_tools(tokenizer)
    schemas = [schema_of(search)]
    turn = 'Let me look.<tool_call>\n{"name": "search", "arguments": {"query": "Oslo"}}\n</tool_call>'
    calls = parse_calls(turn, "hermes")
    message = assistant_message(turn, calls, native=True)
    assert message["content"] == "Let me look." and message["tool_calls"][0]["function"]["arguments"] == {"query": "Oslo"}
    history = [{"role": "user", "content": "Where is Oslo?"}, message]
    rendered = render(tokenizer, history, schemas, add_generation_prompt=False)
    assert '"arguments": {"query": "Oslo"}' in rendered  # a dict through tojson: encoded once, not as a string
    added = inserted_text(tokenizer, history, result_messages(calls, ["Norway"], native=True), schemas)
    assert added == "<|im_start|>user\n<tool_response>\nNorway\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert json.loads(json.dumps(schemas[0]))["function"]["name"] == "search"


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer):
    # Like Qwen3's: an assistant turn's reasoning is shown only while it is the last turn.
    tokenizer.chat_template = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{%- if m.role == 'assistant' and not loop.last %}{{ m.content.split('</think>')[-1] }}"
        "{%- else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{# tools #}")
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>hm</think>call"}]
    with pytest.raises(ToolTemplateError, match="rewrites earlier turns"):
        inserted_text(tokenizer, history, [{"role": "tool", "content": "r"}], [schema_of(search)])
