"""A very small random Qwen2 model with a byte-level tokenizer, for tests.

Independent of the embedded model, so the engine's tests don't depend on how
that model was trained, and gradients can be checked on a model small enough
for finite differences.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import qwen2
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_model(folder: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # Byte-level BPE without merges: one token per byte. transformers loads any
    # model_type "qwen2" tokenizer with Qwen's byte-level pipeline, so the
    # tokenizer must be byte-level to round-trip text.
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(byte_chars))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "unk_token": "<unk>",
        "pad_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE,
    }))
    config = {
        "model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": layers,
        "intermediate_size": hidden * 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6, "vocab_size": len(vocab), "tie_word_embeddings": True,
        "eos_token_id": vocab["<|im_end|>"], "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return folder
