"""Check the tokenizer mlx-grpo rebuilds from GGUF files against llama.cpp's own, on real files.

    python scripts/check_gguf_tokenizer.py MODEL.gguf [MORE.gguf ...] [--texts 2000] [--seed 0]

For each file: the tokenizer as training uses it (gguf_tokenizer.build_tokenizer
on the file's header) and llama.cpp's (llama-cpp-python, vocab_only: no tensors
are read) encode the same texts, with BOS as the file says and special tokens
parsed: a fixed set (prose, code, digits, whitespace runs, accents, CJK, emoji,
the file's own special tokens) and `--texts` random ones. Decoding is checked
against llama.cpp's (llama_detokenize for SentencePiece, the tokens' text for
BPE) where the text does not cut a character.
Where llama.cpp's test vocabularies sit beside the file (FILE.inp and FILE.out,
the ids of the model's own Hugging Face tokenizer), those are checked too.

Prints one line per file (or the one-line error our tokenizer gives for it) and
the first differences; exits 1 when any file differs. Needs llama-cpp-python
(`pip install -e ".[smollm2]"` brings it).
"""

from __future__ import annotations

import argparse
import ctypes
import random
import sys
from pathlib import Path

FIXED = [
    "Question: What is 12 + 7?\nAnswer: 19",
    "  two leading spaces, trailing  ",
    "\n\n\nthree newlines\t\ttabs",
    "def f(x):\n    return {'a': [x ** 2 for x in range(3)]}  # code",
    "1234567 3.14159 -0.5e-3 $12,345.67",
    "it's they'LL I'M we'Ve DON'T",
    "HelloWorld camelCase XMLHttpRequest path/to/file/",
    "Café naïve Straße ÉCOLE",
    "cafe\u0301 \u0915\u093f\u0924\u093e\u092c",
    "日本語のテキスト 中文字符 한국어 Ελληνικά русский",
    "emoji 😀🎉👍🏽 🦙.cpp",
    "\u00a0\u2009\u3000\u200b odd spaces",
    "",
    " ",
    "a",
]
PIECES = [
    "Hello",
    " world",
    "camelCase",
    "ÉCOLE",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "123",
    "4567",
    "3.14",
    "é",
    "日本語",
    "한국어",
    "русский",
    "😀",
    "🎉👍🏽",
    "\u00a0",
    "\u3000",
    "ﬁ",
    "ẞ",
    "\u0301",
    "def f(x):",
    "    return x",
    "{",
    "}",
    "'",
    '"',
    "it's",
    "DON'T",
    "<div>",
    "path/to/",
    "#",
    "!!",
    "…",
    "，",
    "x",
    " ",
]


def llama_detokenize(llama, ids: list[int]) -> str:
    import llama_cpp

    size = 64 + 64 * len(ids)
    text = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(
        llama._model.vocab,
        (llama_cpp.llama_token * max(len(ids), 1))(*ids),
        len(ids),
        text,
        size,
        False,
        True,
    )
    return text.raw[: max(n, 0)].decode("utf-8", errors="replace")


def random_texts(rng: random.Random, specials: list[str], n: int) -> list[str]:
    texts = []
    for i in range(n):
        if i % 3 == 0:  # characters from everywhere
            ranges = [
                (32, 126),
                (32, 126),
                (0xA0, 0x2FFF),
                (0x3000, 0x9FFF),
                (0xAC00, 0xD7A3),
                (0x1F300, 0x1FAFF),
            ]
            texts.append(
                "".join(
                    chr(rng.randint(*rng.choice(ranges))) if rng.random() < 0.9 else rng.choice("\n \t")
                    for _ in range(rng.randint(0, 30))
                )
            )
        else:  # pieces of realistic text, and the file's special tokens
            texts.append("".join(rng.choice(PIECES + specials[:20]) for _ in range(rng.randint(0, 12))))
    return texts


def check(path: Path, n: int, seed: int) -> bool:
    import llama_cpp

    from mlx_grpo.models.gguf_file import GGUFError, read_header
    from mlx_grpo.models.gguf_tokenizer import build_tokenizer

    try:
        meta = read_header(path).metadata
        ours = build_tokenizer(meta)
    except GGUFError as e:
        print(f"{path.name}: refused: {e}")
        return True
    llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    types = meta.get("tokenizer.ggml.token_type") or []
    specials = [t for t, kind in zip(meta["tokenizer.ggml.tokens"], types) if kind in (3, 4)]
    texts = FIXED + random_texts(random.Random(seed), specials, n)
    differ, decodes = [], 0
    for text in texts:
        expected = llama.tokenize(text.encode(), add_bos=True, special=True)
        if ours.encode(text).ids != expected:
            differ.append(text)
            continue
        # SentencePiece: llama_detokenize (its leading-space rule); BPE: the tokens' text as llama.cpp streams
        # it (llama_detokenize drops spaces before punctuation there for some names, which we do not)
        reference = (
            llama_detokenize(llama, expected)
            if meta["tokenizer.ggml.model"] == "llama"
            else llama.detokenize(expected, special=True).decode("utf-8", errors="replace")
        )
        decodes += "\ufffd" not in reference and ours.decode(expected, skip_special_tokens=False) != reference
    line = (
        f"{path.name} ({meta.get('tokenizer.ggml.model')}, {meta.get('tokenizer.ggml.pre')}): "
        f"same ids as llama.cpp on {len(texts) - len(differ)}/{len(texts)} texts, "
        f"decoding differs on {decodes}"
    )
    pairs = path.with_name(path.name + ".inp"), path.with_name(path.name + ".out")
    hf_differ = 0
    if all(p.exists() for p in pairs):
        inputs = pairs[0].read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
        outputs = pairs[1].read_text(encoding="utf-8").split("\n")
        hf_differ = sum(
            ours.encode(t, add_special_tokens=False).ids != [int(i) for i in o.split()]
            for t, o in zip(inputs, outputs)
        )
        line += f"; {len(inputs) - hf_differ}/{len(inputs)} of {pairs[1].name} (Hugging Face's ids)"
    print(line)
    for text in differ[:3]:
        expected = llama.tokenize(text.encode(), add_bos=True, special=True)
        print(f"  {text!r}\n    llama.cpp {expected}\n    ours      {ours.encode(text).ids}")
    return not differ and not decodes and not hf_differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument(
        "--texts", type=int, default=2000, help="random texts per file, beside the fixed ones"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    results = [check(path, args.texts, args.seed) for path in args.files]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
