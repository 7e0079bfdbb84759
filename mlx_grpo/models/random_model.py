"""A model of any shape with random weights from a seed, as an mlx-lm folder: what the benchmarks
(scripts/bench.py and its siblings) time and the tests (tests/tiny.py) train, neither of which
should depend on a download or on how the embedded model was trained.

Its tokenizer is byte-level: three special tokens, then one token per byte, so any text encodes
without merges and round-trips; a vocabulary larger than that is filled with multi-byte tokens
that encoding never reaches but decoding reads (a random model samples them).
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>"]
BYTE_VOCAB = len(SPECIALS) + 256  # the specials and one token per byte: the smallest vocabulary
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_random_model(
    folder: Path,
    hidden,
    layers,
    heads,
    kv_heads,
    intermediate,
    vocab,
    seed=0,
    dtype="float32",
    bits=0,
    model_type="qwen2",
) -> Path:
    """A random Qwen2 (or another mlx-lm architecture: "llama") of the given shape with a byte-level
    tokenizer of `vocab` tokens.

    bits 4 or 8: the weights are quantised (nn.quantize, group 64), as in a QLoRA base.
    """
    import importlib
    from itertools import product

    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = SPECIALS + alphabet
    # Unreachable by encoding (no merges) but decodable: the random model samples them.
    for n in (2, 3):
        for combo in product(alphabet, repeat=n):
            if len(tokens) >= vocab:
                break
            tokens.append("".join(combo))
    tokens = tokens[:vocab]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "unk_token": "<unk>",
                "pad_token": "<|im_end|>",
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )
    config = {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
        "eos_token_id": 2,
        "torch_dtype": dtype,
    }
    mx.random.seed(seed)
    architecture = importlib.import_module(f"mlx_lm.models.{model_type}")
    model = architecture.Model(architecture.ModelArgs.from_dict(config))
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    if bits:
        nn.quantize(model, group_size=64, bits=bits)
        config["quantization"] = {"group_size": 64, "bits": bits}
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return folder
