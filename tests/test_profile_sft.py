"""scripts/profile_sft.py takes both SFT trainers' steps apart on a tiny workload: every phase timed, FLOPs by
hand."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("profile_sft", ROOT / "scripts" / "profile_sft.py")
profile_sft = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_sft)

# 2 rows a step of 8 prompt and 8 completion tokens: 37 tokens with the random model's chat template
# (tests/test_bench_sft.py). sft pads to the longest row, 37; mlx_lm.lora to 1 + 64 = 65.
TINY = [
    "--preset",
    "tiny",
    "--steps",
    "3",
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
    "--sgemm-seconds",
    "0.05",
]
MEASURED = ("batch", "forward", "forward_backward", "optimizer", "step")

# The tiny preset: hidden 64, 2 layers, 4 heads of 16, KV width 32, intermediate 128, vocabulary 512.
# A layer's dense weights 2 x 64 x 64 + 2 x 64 x 32 + 3 x 64 x 128 = 36,864; the head 512 x 64 = 32,768;
# LoRA rank 8 on all 7 linears of both layers: in + out summed over them 2 x 1,024 = 2,048.
WEIGHTS = 2 * 36_864 + 32_768  # 106,496


def by_hand(rows, width):
    """(forward, backward) FLOPs: P positions seeing (width - 1) / 2 keys, every layer adapted."""
    positions, context = rows * (width - 1), (width - 1) / 2
    attention = 2 * 2 * 64 * context  # 2 layers, QK^T and AV, 2 h context a position
    lora = 2 * positions * 8 * 2_048
    return 2 * positions * (WEIGHTS + attention) + lora, 2 * positions * (WEIGHTS + 2 * attention) + 2 * lora


def test_both_sides_every_phase_timed_and_counted(capsys, tmp_path):
    assert by_hand(2, 65) == (33_554_432, 39_845_888)  # worked out: 2 x 128 x 114,688 + 4,194,304; ...
    out_file = tmp_path / "profile.json"
    profile_sft.main([*TINY, "--out", str(out_file)])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out_file.read_text())
    assert printed["workload"]["preset"] == "tiny" and printed["workload"]["tokens_per_step"] == 2 * 37
    assert printed["machine"]["cpu"] and printed["machine"]["mlx"] and printed["blas_kernels"]
    assert "openblas_coretype" in printed
    assert [s["shape"] for s in printed["sgemm"]] == [
        [72, 64, 64],
        [72, 64, 128],
        [72, 128, 64],
        [72, 64, 512],
    ]
    assert all(s["gflops"] > 0 for s in printed["sgemm"])
    if "skipped" in printed["mlx_lm_lora"]:
        pytest.skip(printed["mlx_lm_lora"]["skipped"])
    for side, width in (("mlx_grpo", 37), ("mlx_lm_lora", 65)):
        figures = printed[side]
        phases = figures["phases"]
        assert set(phases) == set(profile_sft.PHASES), side
        assert all(phases[name]["seconds"] > 0 for name in MEASURED), (side, phases)
        assert phases["backward"]["seconds"] == pytest.approx(
            phases["forward_backward"]["seconds"] - phases["forward"]["seconds"]
        )
        assert phases["other"]["seconds"] == pytest.approx(
            phases["step"]["seconds"]
            - phases["batch"]["seconds"]
            - (phases["forward_backward"]["seconds"] + phases["optimizer"]["seconds"])
        )
        assert figures["steps_timed"] == 2 and all(len(v) == 3 for v in figures["phase_seconds"].values())
        assert figures["batch_shapes"] == [[2, width]]
        forward, backward = by_hand(2, width)
        assert figures["flops_per_step"] == {"forward": forward, "backward": backward}, side
        assert phases["forward_backward"]["flops"] == phases["step"]["flops"] == forward + backward
        # backward is a difference of two medians: on a loaded machine it can come out <= 0, and then
        # has no rate rather than a negative one
        for name in ("forward", "backward", "forward_backward", "step"):
            seconds = phases[name]["seconds"]
            rate = phases[name]["flops"] / seconds / 1e9 if seconds > 0 else None
            assert phases[name]["gflops"] == pytest.approx(rate)
        assert "flops" not in phases["optimizer"] and "flops" not in phases["batch"]
    assert (
        printed["mlx_lm_lora"]["trainable_parameters"]
        == printed["mlx_grpo"]["trainable_parameters"]
        == 16_384
    )
    assert printed["peer_over_sft_seconds"]["step"] == pytest.approx(
        printed["mlx_lm_lora"]["phases"]["step"]["seconds"] / printed["mlx_grpo"]["phases"]["step"]["seconds"]
    )


@pytest.mark.parametrize(
    "flags",
    [["--peer", "off"], ["--order=mlx_lm_lora,mlx_grpo"], ["--warmup", "0"], ["--sgemm-seconds", "0"]],
)
def test_bad_settings_are_one_clear_line(flags, capsys):
    with pytest.raises(SystemExit):
        profile_sft.main([*TINY, *flags])
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err
