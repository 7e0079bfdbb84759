"""Fetch real model chat templates for tests/test_tool_templates_real.py (they are not in this repository).

llama.cpp keeps real models' chat templates in models/templates/*.jinja (Qwen2.5,
Qwen3, QwQ, Llama 3.1-3.3, Hermes 2 Pro and 3, Mistral Nemo and Small 3.2,
Ministral 3, Devstral, and more), and llama-cpp-python's source distribution
vendors llama.cpp. This downloads that distribution with pip (nothing is
installed or built) and copies the templates out:

    python scripts/get_chat_templates.py [--dest FOLDER] [--version 0.3.36]

FOLDER defaults to $MLX_GRPO_CACHE/chat-templates, else ~/.cache/mlx-grpo/chat-templates,
where the tests look; elsewhere, point MLX_GRPO_TEMPLATES_DIR at it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

VERSION = "0.3.36"  # the llama-cpp-python release the templates were checked from


def default_dest() -> Path:
    return Path(os.environ.get("MLX_GRPO_CACHE") or Path.home() / ".cache" / "mlx-grpo") / "chat-templates"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=default_dest())
    parser.add_argument("--version", default=VERSION, help="llama-cpp-python release (default %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-binary",
                ":all:",
                "--no-deps",
                "--quiet",
                "-d",
                tmp,
                f"llama-cpp-python=={args.version}",
            ],
            check=True,
        )
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        args.dest.mkdir(parents=True, exist_ok=True)
        count = 0
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                path = PurePosixPath(member.name)
                if member.isfile() and path.suffix == ".jinja" and path.parent.match("*/models/templates"):
                    (args.dest / path.name).write_bytes(tar.extractfile(member).read())
                    count += 1
    print(f"{count} chat templates in {args.dest}")
    return 0 if count else 1


if __name__ == "__main__":
    sys.exit(main())
