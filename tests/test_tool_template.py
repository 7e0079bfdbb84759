"""Tools through the model's template or the fallback; what is inserted between turns is a clean
difference."""

import json

import pytest
from tool_conversations import check_episode

from mlx_grpo.models.loading import load_policy
from mlx_grpo.tools import parse_calls, schema_of, style_for_template
from mlx_grpo.tools.template import (
    ToolTemplateError,
    assistant_message,
    inserted_text,
    render,
    result_messages,
    template_supports_tools,
)

# A small tools-aware template written for this test, in the shape Qwen2.5's takes:
# schemas in the system turn, calls as <tool_call> JSON (arguments through tojson), results as
# <tool_response>.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n"
    "<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    '{%- for c in m.tool_calls %}\n<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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
    text = render(
        tokenizer, [{"role": "user", "content": "Where is Oslo?"}], schemas, add_generation_prompt=True
    )
    assert '"name": "search"' in text and "<tool_call>" in text and text.endswith("assistant\n")
    turn = '<tool_call>\n{"name": "search", "arguments": {"query": "Oslo"}}\n</tool_call>'
    calls = parse_calls(turn, "hermes")
    history = [{"role": "user", "content": "Where is Oslo?"}, assistant_message(turn, calls, native=False)]
    added = inserted_text(
        tokenizer, history, result_messages(calls, ["Oslo is in Norway."], native=False), schemas
    )
    assert added == (
        "<|im_start|>user\n<tool_response>\nOslo is in Norway.\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_tools_aware_template_renders_calls_and_results_natively(tokenizer):
    tokenizer.chat_template = TOOLS_TEMPLATE
    assert template_supports_tools(tokenizer)
    schemas = [schema_of(search)]
    turn = 'Let me look.<tool_call>\n{"name": "search", "arguments": {"query": "Oslo"}}\n</tool_call>'
    calls = parse_calls(turn, "hermes")
    message = assistant_message(turn, calls, native=True)
    assert message["content"] == "Let me look." and message["tool_calls"][0]["function"]["arguments"] == {
        "query": "Oslo"
    }
    history = [{"role": "user", "content": "Where is Oslo?"}, message]
    rendered = render(tokenizer, history, schemas, add_generation_prompt=False)
    assert (
        '"arguments": {"query": "Oslo"}' in rendered
    )  # a dict through tojson: encoded once, not as a string
    added = inserted_text(tokenizer, history, result_messages(calls, ["Norway"], native=True), schemas)
    assert (
        added
        == "<|im_start|>user\n<tool_response>\nNorway\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert json.loads(json.dumps(schemas[0]))["function"]["name"] == "search"


# Small templates written here in the shape each family's takes (tests/test_tool_templates_real.py runs the
# real ones when they are on the machine): what matters is where calls, results and headers go.

# Llama 3.x: headers, a JSON object with "parameters" for a call, one call a message, results as "ipython".
LLAMA3_TEMPLATE = (
    "{{- bos_token }}<|start_header_id|>system<|end_header_id|>\n\n{%- if tools %}Answer with JSON to call a "
    'function: {"name": its name, "parameters": its arguments}.\n{% for t in tools %}{{ t | tojson }}\n'
    "{% endfor %}{% endif %}<|eot_id|>"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{%- elif m.tool_calls %}{% if m.tool_calls | length != 1 %}{{ raise_exception('one call a message') }}"
    "{% endif %}{% set c = m.tool_calls[0].function %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    '{"name": "{{ c.name }}", "parameters": {{ c.arguments | tojson }}}<|eot_id|>'
    "{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# Mistral: the tools before the question, a turn's calls as a [TOOL_CALLS] list after its text, each with
# an id of 9 characters that its result names, results as [TOOL_RESULTS], no generation prompt.
MISTRAL_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{% if tools and loop.first %}[AVAILABLE_TOOLS]{{ tools | tojson }}"
    "[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]"
    '{%- elif m.role == \'tool\' %}[TOOL_RESULTS]{"call_id": "{{ m.tool_call_id }}", "content": '
    "{{ m.content | tojson }}}[/TOOL_RESULTS]"
    "{%- elif m.tool_calls %}{{ m.content }}[TOOL_CALLS][{% for c in m.tool_calls %}"
    "{% if c.id is not defined or c.id | length != 9 %}{{ raise_exception('a call needs an id of 9') }}"
    "{% endif %}"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, "id": '
    '"{{ c.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}'
    "{%- else %}{{ m.content }}{{ eos_token }}{% endif %}{%- endfor %}"
)

# Qwen3 and QwQ: ChatML and Hermes calls; the last assistant turn is written with its <think> block (an
# empty one when it has none), an earlier one without.
QWEN3_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{% set answer = m.content.split('</think>')[-1].lstrip('\n') %}"
    "{% set reasoning = m.content.split('</think>')[0].split('<think>')[-1].strip('\n') "
    "if '</think>' in m.content else '' %}<|im_start|>assistant\n"
    "{% if loop.last %}<think>\n{{ reasoning }}\n</think>\n\n{% endif %}{{ answer }}"
    "{%- for c in m.tool_calls or [] %}{% if answer or not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": '
    '"{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}'
    "<|im_end|>\n"
    "{%- elif m.role == 'tool' %}{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "<|im_start|>user"
    "{% endif %}{{ '\\n' }}<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize(
    "template, style, prefix",
    [
        (TOOLS_TEMPLATE, "hermes", True),
        (LLAMA3_TEMPLATE, "llama3", True),
        (MISTRAL_TEMPLATE, "mistral", True),
        (QWEN3_TEMPLATE, "hermes", False),
    ],
    ids=["qwen2.5-like", "llama3-like", "mistral-like", "qwen3-like"],
)
def test_each_familys_template_carries_a_tool_episode(tokenizer, template, style, prefix):
    """Several turns, several calls a turn, text before calls: the style the template teaches reads back
    the calls it writes, arguments are written once, and what goes between turns is the template's own
    difference, the same whether or not the turns reason (the Qwen3-like template drops their reasoning
    once they are not last: inserted_text takes it from where the turn ends)."""
    tokenizer.chat_template = template
    assert style_for_template(template) == style
    plain = check_episode(tokenizer, style)
    thinking = check_episode(tokenizer, style, think=True)
    assert [s.inserted for s in plain] == [s.inserted for s in thinking]
    assert {s.prefix for s in plain + thinking} == {prefix}


def test_what_each_family_inserts(tokenizer):
    tokenizer.chat_template = LLAMA3_TEMPLATE
    steps = check_episode(tokenizer, "llama3")
    # Two calls in a turn: the template takes one a message, so they go as two messages; results as ipython.
    assert steps[1].text == (
        '{"name": "search", "parameters": {"query": "Norway capital"}}; '
        '{"name": "lookup", "parameters": {"title": "Oslo", "limit": 2}}'
    )
    assert steps[1].inserted == (
        "<|start_header_id|>ipython<|end_header_id|>\n\nresult 1.0 of search<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\nresult 1.1 of lookup<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    tokenizer.chat_template = MISTRAL_TEMPLATE
    steps = check_episode(tokenizer, "mistral")
    ids = [c["id"] for c in assistant_message(steps[1].text, steps[1].calls, native=True)["tool_calls"]]
    assert len(set(ids)) == 2 and all(len(i) == 9 and i.isalnum() for i in ids)
    assert steps[1].inserted == "".join(
        f'[TOOL_RESULTS]{{"call_id": "{i}", "content": "result 1.{k} of {n}"}}[/TOOL_RESULTS]'
        for k, (i, n) in enumerate(zip(ids, ["search", "lookup"]))
    )
    tokenizer.chat_template = QWEN3_TEMPLATE
    steps = check_episode(tokenizer, "hermes", think=True)
    assert steps[0].inserted == (
        "<|im_start|>user\n<tool_response>\nresult 0.0 of search\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_an_id_the_model_wrote_is_the_one_its_result_names(tokenizer):
    tokenizer.chat_template = MISTRAL_TEMPLATE
    turn = 'Looking.[TOOL_CALLS]search[CALL_ID]abc123XYZ[ARGS]{"query": "Oslo"}'
    calls = parse_calls(turn, "mistral")
    assert [(c.name, c.arguments, c.id) for c in calls] == [("search", {"query": "Oslo"}, "abc123XYZ")]
    message = assistant_message(turn, calls, native=True)
    assert message["content"] == "Looking." and message["tool_calls"][0]["id"] == "abc123XYZ"
    assert result_messages(calls, ["Norway"], native=True)[0]["tool_call_id"] == "abc123XYZ"
    calls = parse_calls(
        '[TOOL_CALLS][{"name": "search", "arguments": {"query": "x"}, "id": "k9k9k9k9k"}]', "mistral"
    )
    assert calls[0].id == "k9k9k9k9k"


def test_a_template_that_rewrites_an_earlier_turn_is_refused_in_one_line(tokenizer):
    # The system turn counts the results so far: every result rewrites it.
    tokenizer.chat_template = (
        "<|im_start|>system\n{{ messages | selectattr('role', 'equalto', 'tool') | list "
        "| length }} results so far{# tools #}<|im_end|>\n" + QWEN3_TEMPLATE
    )
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "call"}]
    with pytest.raises(ToolTemplateError, match="rewrites earlier turns") as refused:
        inserted_text(tokenizer, history, [{"role": "tool", "content": "r"}], [schema_of(search)])
    assert "\n" not in str(refused.value)


def test_a_template_that_writes_results_inside_the_models_turn_is_refused(tokenizer):
    """Like gemma-4's: the results go after the turn's calls and before its text, inside the turn. The turn's
    <think> block and a tail of it ("<|tool_response>") must not pass for a dropped reasoning block."""
    tokenizer.chat_template = (
        "{%- set ns = namespace(content='') %}{%- for m in messages %}"
        "{%- if m.role == 'assistant' %}<|turn>model\n{% for c in m.tool_calls %}"
        "<|tool_call>{{ c.function.name }}"
        "{{ c.function.arguments | tojson }}<tool_call|>{% endfor %}{% set ns.content = m.content %}"
        "{% if loop.last %}{{ m.content }}<|tool_response>{% endif %}"
        "{%- elif m.role == 'tool' %}<|tool_response>{{ m.content }}<tool_response|>"
        "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
        "{{ ns.content }}<turn|>{{ '\\n' }}{% endif %}"
        "{%- else %}<|turn>{{ m.role }}\n{{ m.content }}<turn|>{{ '\\n' }}{% endif %}{% endfor %}"
        "{%- if add_generation_prompt %}<|turn>model\n{% endif %}{# tools #}"
    )
    for text in ("Let me look.", "<think>\nhm\n</think>\n\nLet me look."):
        turn = {
            "role": "assistant",
            "content": text,
            "tool_calls": [
                {
                    "type": "function",
                    "id": "abcdefghi",
                    "function": {"name": "search", "arguments": {"query": "Oslo"}},
                }
            ],
        }
        with pytest.raises(ToolTemplateError, match="rewrites earlier turns"):
            inserted_text(
                tokenizer,
                [{"role": "user", "content": "q"}, turn],
                [{"role": "tool", "tool_call_id": "abcdefghi", "content": "r"}],
                [schema_of(search)],
            )


def test_a_template_that_refuses_the_conversation_says_so_in_one_line(tokenizer):
    tokenizer.chat_template = (
        "{{ raise_exception('Only user and assistant roles are supported!') }}{# tools #}"
    )
    with pytest.raises(ToolTemplateError, match="cannot render this tool conversation: Only user") as refused:
        render(tokenizer, [{"role": "user", "content": "q"}], [schema_of(search)], add_generation_prompt=True)
    assert "\n" not in str(refused.value)


def test_xml_calls_are_refused_rather_than_misread():
    with pytest.raises(ValueError, match="XML"):
        style_for_template("<tool_call>\n<function={{ name }}>\n<parameter={{ key }}>")
