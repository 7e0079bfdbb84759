"""scripts/bench_sft.py runs sft and mlx_lm.lora on the same small workload and reports both."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from mlx_grpo.models.random_model import build_random_model

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_sft", ROOT / "scripts" / "bench_sft.py")
bench_sft = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_sft)
spec = importlib.util.spec_from_file_location("bench_sft_sides", ROOT / "scripts" / "bench_sft_sides.py")
bench_sft_sides = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_sft_sides)

# 2 rows a step of 8 prompt and 8 completion tokens; the random model's chat template adds 21 tokens
# ("<|im_start|>user\n" 6, "<|im_end|>\n" 2, "<|im_start|>assistant\n" 11, "<|im_end|>\n" 2).
TINY = [
    "--preset",
    "tiny",
    "--steps",
    "2",
    "--warmup",
    "1",
    "--batch-size",
    "2",
    "--prompt-tokens",
    "8",
    "--completion-tokens",
    "8",
    "--blas",
    "stock",
]
ROW = 8 + 8 + 21
POSITIVE = (
    "step_s",
    "own_step_s",
    "tokens_per_s",
    "trained_tokens_per_s",
    "peak_memory_gb",
    "rss_peak_gb",
    "trainable_parameters",
)


def _positive(figures):
    return {key: figures[key] for key in POSITIVE if not figures[key] > 0}


def test_both_sides_run_the_same_rows_and_report_positive_figures(capsys, tmp_path):
    out_file = tmp_path / "sft.json"
    bench_sft.main([*TINY, "--out", str(out_file)])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out_file.read_text())
    workload = printed["workload"]
    # sft's count, by hand: every row token, and trained the completion with its end token
    assert workload["tokens_per_step"] == 2 * ROW and workload["trained_tokens_per_step"] == 2 * (8 + 1)
    ours = printed["mlx_grpo"]
    assert _positive(ours) == {} and ours["steps_timed"] == 1 and ours["row_lengths"] == [ROW]
    assert ours["tokens_per_s"] == pytest.approx(2 * ROW / ours["step_s"])
    assert ours["padding_share"] == 0.0  # rows of one length: sft pads nothing
    assert printed["blas_kernels"] and printed["machine"]["cpu"] and printed["machine"]["uptime"]
    if "skipped" in printed["mlx_lm_lora"]:
        pytest.skip(printed["mlx_lm_lora"]["skipped"])
    peer = printed["mlx_lm_lora"]
    assert _positive(peer) == {} and peer["steps_timed"] == 1 and peer["row_lengths"] == [ROW]
    assert peer["trainable_parameters"] == ours["trainable_parameters"]  # the same adapters on both sides
    assert peer["padded_tokens_per_step"] == 2 * 65  # mlx_lm.lora pads 37 to 1 + 64
    assert peer["loss_first"] == pytest.approx(ours["loss_first"], rel=0.1)  # one random model, one loss
    assert printed["speedup"] == pytest.approx(ours["tokens_per_s"] / peer["tokens_per_s"])
    assert printed["memory_ratio"] == pytest.approx(ours["peak_memory_gb"] / peer["peak_memory_gb"])


def test_the_peer_side_is_skipped_with_its_reason_when_it_cannot_run(capsys, monkeypatch):
    monkeypatch.setattr(
        bench_sft, "peer_problem", lambda: "mlx_lm.lora cannot be imported (here: on purpose)"
    )
    bench_sft.main(TINY)
    printed = json.loads(capsys.readouterr().out)
    assert printed["mlx_lm_lora"] == {"skipped": "mlx_lm.lora cannot be imported (here: on purpose)"}
    assert _positive(printed["mlx_grpo"]) == {} and "speedup" not in printed


def test_rows_have_the_asked_token_lengths(tmp_path):
    from transformers import AutoTokenizer

    folder = build_random_model(tmp_path / "m", **bench_sft.PRESETS["tiny"])
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    rng = np.random.default_rng(0)
    assert [
        len(tokenizer.encode(bench_sft.fixed_length_text(tokenizer, n, rng), add_special_tokens=False))
        for n in (1, 7, 64)
    ] == [1, 7, 64]


def test_mlx_lm_lora_padding_by_hand():
    widths = [bench_sft_sides.padded_width_peer(n) for n in (1, 32, 33, 37, 256, 257)]
    assert widths == [33, 33, 65, 65, 257, 289]


@pytest.mark.parametrize(
    "flags",
    [
        ["--warmup", "0"],
        ["--steps", "2", "--warmup", "2"],
        ["--batch-size", "0"],
        ["--preset", "tiny", "--lora-layers", "3"],
        ["--order", "mlx_grpo"],
    ],
)
def test_bad_settings_are_one_clear_line(flags, capsys):
    with pytest.raises(SystemExit) as stopped:
        bench_sft.main([*TINY, *flags])
    message = str(stopped.value.code) if stopped.value.code not in (0, 2) else capsys.readouterr().err
    assert "error" in message and "Traceback" not in message
