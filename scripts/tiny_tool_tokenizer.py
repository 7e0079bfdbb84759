"""The tiny tool model's tokenizer, for scripts/build_tiny_tool_model.py: a byte-level BPE learnt from
the multihop episodes (every name one token, no space merged into a word) and the model's own compact
chat template for tools.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_tiny_model as base  # noqa: E402  (tokenizer files: the split pattern, special tokens, saving)


def build_tokenizer(texts: list[str]):
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
        vocab_size=1600,
        min_frequency=2,
        special_tokens=base.SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
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
    # The same for a double quote (the answer's '"Pabangi"', a title's '"Facy'): Qwen2's split keeps one
    # punctuation mark with the word that follows it, so a quote could otherwise join a frequent name.
    state["model"]["merges"] = [
        m
        for m, (a, b) in zip(merges, pairs)
        if not ((a + b).startswith("Ġ") and set(a + b) != {"Ġ"})
        and not ((a + b).startswith('"') and any(c.isalpha() for c in a + b))
    ]
    return Tokenizer.from_str(json.dumps(state))


# The model's own chat template knows tools (as Qwen2.5's does), in a compact form: the system
# turn names each tool and its arguments on one line instead of the JSON schemas, calls are
# Hermes-style <tool_call> blocks, results come back as user turns of <tool_response>. A prompt
# is then about 40 tokens, not the fallback's 450, which a model of half a million parameters
# needs to find the name to copy.
TOOL_TEMPLATE = (
    "{%- if tools -%}{{ '<|im_start|>system\\nTools:' }}"
    "{%- for tool in tools %} {{ tool.function.name }}"
    "({{ tool.function.parameters.properties | list | join(', ') }})"
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
    '{{ \'<tool_call>\\n{"name": "\' + call.function.name + \'", "arguments": \' '
    "+ (call.function.arguments | tojson) + '}\\n</tool_call>' }}"
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
