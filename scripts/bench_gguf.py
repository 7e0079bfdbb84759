"""Time a real GGUF model through mlx-grpo: import, greedy decoding 4-bit vs float32, export.

    python scripts/bench_gguf.py                      # smollm2-135m (pip install -e ".[smollm2,gguf]")
    python scripts/bench_gguf.py --model PATH.gguf --tokens 64 --outtypes f16,q8_0

Prints one JSON object:
  - import_s: converting the GGUF into the cached mlx-lm folder (a fresh cache), then
    loading it (cached_load_s: the folder already there);
  - decode: greedy tokens/s of one prompt, the model as stored (4-bit) and widened to
    float32 (what a CPU runs faster), timed in turn --repeats times, and whether both
    wrote the same text;
  - export: per output type, the seconds to fuse random LoRA adapters (rank 8, all
    layers) into the model and write the GGUF file, and the file's size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
from benchlib import Timer, emit_result, load_average  # noqa: E402

PROMPT = "Explain in three sentences why the sky is blue."


def greedy_speed(model, tokenizer, tokens: int) -> dict:
    from mlx_lm import generate

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    generate(model, tokenizer, prompt, max_tokens=4, verbose=False)  # warm-up
    cpu_start = time.process_time()
    with Timer() as timer:
        text = generate(model, tokenizer, prompt, max_tokens=tokens, verbose=False)
    seconds, cpu_seconds = timer.seconds, time.process_time() - cpu_start
    written = len(tokenizer.encode(text))
    # CPU seconds (all threads) say less about the machine's load than the wall clock does.
    return {
        "tokens": written,
        "seconds": round(seconds, 2),
        "tok_per_s": round(written / seconds, 1),
        "tok_per_cpu_s": round(written / cpu_seconds, 1),
        "text": text,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m", help="a .gguf file or a packaged model alias")
    parser.add_argument("--tokens", type=int, default=100, help="greedy tokens to time")
    parser.add_argument("--repeats", type=int, default=3, help="timed decodes of each kind, taken in turn")
    parser.add_argument("--outtypes", default="f16,q8_0,q4_0", help="GGUF types to export ('' for none)")
    args = parser.parse_args()

    from mlx_grpo.blas import use_openblas

    use_openblas()  # before MLX loads: the process re-executes itself with OpenBLAS preloaded
    import mlx.core as mx

    from mlx_grpo.models import export as ex
    from mlx_grpo.models.adapters import prepare_for_training, save_adapters
    from mlx_grpo.models.loading import load_policy, resolve_model_path

    work = Path(tempfile.mkdtemp(prefix="bench-gguf-"))
    os.environ["MLX_GRPO_CACHE"] = str(work / "cache")  # a fresh cache: the first import converts
    source = resolve_model_path(args.model)
    result = {
        "load_avg_1min": load_average()[0],
        "model": args.model,
        "file": source,
        "file_mb": round(Path(source).stat().st_size / 1e6, 1),
    }

    with Timer() as timer:
        model, tokenizer = load_policy(args.model, keep_quantized=True)
    result["import_s"] = round(timer.seconds, 2)
    with Timer() as timer:
        model, tokenizer = load_policy(args.model, keep_quantized=True)
    result["cached_load_s"] = round(timer.seconds, 2)

    widened, _ = load_policy(args.model, keep_quantized=True)
    ex.fuse_in_float32(widened)  # no adapters: only widens the quantized layers
    # Turn about, so that both see the same machine load (this CPU is shared).
    runs = {"stored": [], "float32": []}
    for _ in range(args.repeats):
        runs["stored"].append(greedy_speed(model, tokenizer, args.tokens))
        runs["float32"].append(greedy_speed(widened, tokenizer, args.tokens))
    decode = {
        kind: {
            "tok_per_s": [r["tok_per_s"] for r in rs],
            "median_tok_per_s": statistics.median(r["tok_per_s"] for r in rs),
            "median_tok_per_cpu_s": statistics.median(r["tok_per_cpu_s"] for r in rs),
            "tokens": rs[0]["tokens"],
            "text": rs[0]["text"],
        }
        for kind, rs in runs.items()
    }
    decode["same_text"] = decode["stored"]["text"] == decode["float32"]["text"]
    decode["float32_speedup"] = round(
        decode["float32"]["median_tok_per_s"] / decode["stored"]["median_tok_per_s"], 2
    )
    result["decode"] = decode
    del widened

    exports = {}
    outtypes = [t for t in args.outtypes.split(",") if t]
    if outtypes:
        model, _ = load_policy(args.model, keep_quantized=True)
        adapter_config = prepare_for_training(model, "lora", {"rank": 8})
        for _, module in model.named_modules():
            if hasattr(module, "lora_b"):
                module.lora_b = mx.random.normal(module.lora_b.shape) * 0.01
        save_adapters(model, work / "adapters", {**adapter_config, "model": source})
        for outtype in outtypes:
            out = work / f"export-{outtype}.gguf"
            with Timer() as timer:
                ex.export(args.model, str(work / "adapters"), gguf_path=str(out), outtype=outtype)
            exports[outtype] = {"seconds": round(timer.seconds, 1), "mb": round(out.stat().st_size / 1e6, 1)}
            out.unlink()
    result["export"] = exports
    emit_result(result, None, indent=1)


if __name__ == "__main__":
    main()
