"""Tool episodes through the real chat templates of the model families we support, when they are here.

The templates are other projects' files and are not in this repository: the
tests read every *.jinja in $MLX_GRPO_TEMPLATES_DIR, else in
$MLX_GRPO_CACHE/chat-templates or ~/.cache/mlx-grpo/chat-templates, which
`python scripts/get_chat_templates.py` fills from llama.cpp's collection of
real model templates (models/templates, vendored in llama-cpp-python's source
distribution). Without such a folder (CI) they skip, saying so.

Each template goes on the tiny model's tokenizer and through our own path
(tests/tool_conversations.py): an episode of several turns, several calls a
turn, content before calls; the style chosen from the template reads back the
calls the template writes; arguments are written once as JSON; what is
inserted between turns is the difference the template makes, and it is the
same whether or not the turns hold a <think> block that the template drops.
"""

import os
import re
from pathlib import Path

import pytest
from tool_conversations import check_episode

from mlx_grpo.models.loading import load_policy
from mlx_grpo.tools import render, style_for_template


def templates_dir() -> Path | None:
    named = os.environ.get("MLX_GRPO_TEMPLATES_DIR")
    if named:
        return Path(named)
    cache = Path(os.environ.get("MLX_GRPO_CACHE") or Path.home() / ".cache" / "mlx-grpo")
    return cache / "chat-templates"


# (file name pattern, family, the style chosen from the template, which turns the template rewrites once a
# message follows: None (none), "plain" (a turn without reasoning gets an empty <think> block only while
# last),
# "reasoning" (a turn's <think> block is dropped once it is not last)). First match wins.
FAMILIES = [
    (r"hermes-[23]", "Hermes", "hermes", None),
    (r"qwq", "QwQ", "hermes", "reasoning"),
    (r"qwen3-coder|qwen3\.5", "Qwen3-Coder / Qwen3.5", None, None),  # XML calls: refused
    (r"qwen2\.5", "Qwen2.5", "hermes", None),
    (r"qwen3", "Qwen3", "hermes", "plain"),
    (r"llama-3\.[123]", "Llama 3.x", "llama3", None),
    (r"mistral|ministral|devstral", "Mistral", "mistral", None),
]


def _family(name: str):
    return next((f for f in FAMILIES if re.search(f[0], name, re.I)), None)


def _templates() -> list:
    folder = templates_dir()
    found = sorted(p for p in folder.glob("*.jinja") if _family(p.name)) if folder and folder.is_dir() else []
    if not found:
        return [
            pytest.param(
                None,
                marks=pytest.mark.skip(
                    reason=f"no real chat templates of a supported family in {folder}: "
                    "set MLX_GRPO_TEMPLATES_DIR, or run "
                    "python scripts/get_chat_templates.py"
                ),
            )
        ]
    return [pytest.param(p, id=p.stem) for p in found]


TEMPLATES = _templates()


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_path):
    return load_policy(str(tiny_model_path))[1]


@pytest.fixture()
def tokenizer(tiny_tokenizer):
    original = tiny_tokenizer.chat_template
    yield tiny_tokenizer
    tiny_tokenizer.chat_template = original


def _use(tokenizer, path: Path) -> str:
    template = path.read_text()
    tokenizer.chat_template = template
    return template


@pytest.mark.parametrize("path", TEMPLATES)
def test_a_real_template_carries_a_tool_episode(tokenizer, path):
    _, family, style, rewrites = _family(path.name)
    template = _use(tokenizer, path)
    if style is None:
        with pytest.raises(ValueError, match=r"<function=NAME>.*XML"):
            style_for_template(template)
        return
    assert style_for_template(template) == style, family
    plain = check_episode(tokenizer, style)
    thinking = check_episode(tokenizer, style, think=True)
    # What goes between the turns does not depend on the turn's reasoning, dropped or kept.
    assert [s.inserted for s in plain] == [s.inserted for s in thinking]
    # Where the template keeps every turn, the rendering with the new messages is the one without them plus
    # the inserted text; where it rewrites the model's last turn, inserted_text took the handled path.
    assert [s.prefix for s in plain] == [rewrites != "plain"] * len(plain), family
    assert [s.prefix for s in thinking] == [rewrites != "reasoning"] * len(thinking), family


@pytest.mark.parametrize("path", TEMPLATES)
def test_arguments_given_as_a_string_would_be_encoded_twice_where_the_template_does_not_check(
    tokenizer, path
):
    """Why assistant_message passes the arguments as a dict: a template that applies tojson to whatever it
    gets (Qwen2.5's, Llama 3.x's) writes a JSON string as a quoted, escaped string."""
    _, family, style, _ = _family(path.name)
    template = _use(tokenizer, path)
    if style is None or re.search(r"arguments\s+is\s+(not\s+)?string", template):
        pytest.skip(f"{family}'s template writes string arguments as they are")
    history = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "id": "abcdefghi",
                    "function": {"name": "search", "arguments": '{"query": "Oslo"}'},
                }
            ],
        },
    ]
    assert r'"{\"query\": \"Oslo\"}"' in render(tokenizer, history, [], add_generation_prompt=False)
