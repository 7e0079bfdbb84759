"""scripts/profile_update.py takes a tiny update apart: every part timed, the FLOP counts as worked by
hand."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("profile_update", ROOT / "scripts" / "profile_update.py")
profile_update = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_update)

TIMED = {"update", "forward", "prompt", "head", "body", "matmuls", "lora", "attention"}
TINY = [
    "--preset",
    "tiny",
    "--prompts",
    "1",
    "--prompt-tokens",
    "5",
    "--group-size",
    "4",
    "--max-tokens",
    "6",
    "--repeats",
    "1",
]

# The tiny preset: hidden 64, 2 layers, 4 heads of 16, 2 KV heads (width 32), intermediate 128, vocabulary
# 512.
# A layer's linears: q and o 64x64, k and v 64x32, gate, up and down 64x128.
LAYER_WEIGHTS = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128  # 36,864
# The body runs the completions' first 5 of 6 tokens (the prompt's last position scores the first): 4 x 5
# rows.
BODY_ROWS = 4 * 5
DENSE = 2 * 2 * BODY_ROWS * LAYER_WEIGHTS * 2  # forward x W^T and backward dY W, 2 layers: 5,898,240
# LoRA rank 8 on each of the 7 linears: in + out summed is 128 + 96 + 96 + 128 + 3 * 192 = 1,024.
LORA = 3 * 2 * BODY_ROWS * 8 * 1024 * 2  # 1,966,080
# bench.step_flops' update: a token's weights 2 x 36,864 + the head's 512 x 64 = 106,496, attention 2 layers x
# 2 x 64 x context; the prompt once (5 tokens, context 2.5), 4 completions (6 tokens, context 5 + 3); x 2.
UPDATE = 2 * (2 * 5 * (106_496 + 256 * 2.5) + 4 * 2 * 6 * (106_496 + 256 * 8))  # 12,562,944


@pytest.mark.parametrize(
    "micro_batch,shapes", [(None, [[4, 6]]), (2, [[2, 6], [2, 6]])], ids=["whole_group", "pieces_of_2"]
)
def test_every_part_is_timed_and_counted(capsys, tmp_path, micro_batch, shapes):
    path = tmp_path / "profile.json"
    extra = ["--micro-batch", str(micro_batch)] if micro_batch else []
    profile_update.main([*TINY, *extra, "--json", str(path)])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(path.read_text())
    assert printed["micro_batches"] == shapes and printed["prompt_runs"] == 1
    assert printed["body_rows"] == [BODY_ROWS // len(shapes)] * len(shapes)

    parts = printed["parts"]
    assert set(parts) == TIMED | {"everything_else", "body_other"}
    assert all(parts[name]["seconds"] > 0 for name in TIMED)
    total = parts["update"]["seconds"]
    assert parts["update"]["share"] == 1.0
    assert all(p["share"] == pytest.approx(p["seconds"] / total) for p in parts.values())
    assert parts["everything_else"]["seconds"] == pytest.approx(
        total - parts["prompt"]["seconds"] - parts["head"]["seconds"] - parts["body"]["seconds"]
    )
    assert parts["body_other"]["seconds"] == pytest.approx(
        parts["body"]["seconds"]
        - parts["matmuls"]["seconds"]
        - parts["lora"]["seconds"]
        - parts["attention"]["seconds"]
    )

    # The same FLOPs however the group is cut.
    assert parts["matmuls"]["flops"] == DENSE == 5_898_240
    assert parts["lora"]["flops"] == LORA == 1_966_080
    assert parts["update"]["flops"] == UPDATE == 12_562_944
    for name in ("update", "matmuls", "lora"):
        assert parts[name]["gflops"] == pytest.approx(parts[name]["flops"] / parts[name]["seconds"] / 1e9)
    assert printed["update_gflops"] == parts["update"]["gflops"]
    assert printed["update_tokens_per_s"] == pytest.approx(4 * 6 / total)

    sgemm = printed["sgemm"]
    assert sgemm["reference_shape"] == [
        4 * (5 + 6),
        64,
        128,
    ]  # bench.py --limits: rows x (prompt + completion)
    assert sgemm["own_shape"] == [BODY_ROWS // len(shapes), 64, 128]
    assert sgemm["reference_gflops"] > 0 and sgemm["own_gflops"] > 0
    assert printed["update_frac_of_sgemm"] == pytest.approx(
        printed["update_gflops"] / sgemm["reference_gflops"]
    )
    assert printed["matmuls_at_own_sgemm_s"] == pytest.approx(DENSE / sgemm["own_gflops"] / 1e9)
    assert printed["blas_kernels"] and printed["workload"]["vocab"] == 512


def test_adapters_on_the_top_layer_count_its_backward_alone(capsys):
    """--lora-layers 1 of the tiny preset's 2: the forward runs both layers, the backward the top one and the
    head. Dense: x W^T in 2 layers and dY W in 1, 2 m in out each: 6 x 20 x 36,864 = 4,423,680. LoRA: the top
    layer's 7 linears alone, half of LORA. Update: the forward (UPDATE / 2 = 6,281,472) plus a backward of one
    layer and the head: a token's weights 36,864 + 32,768 = 69,632, attention 128 x context; the prompt once
    (5 tokens, context 2.5), 4 completions (6 tokens, context 8): 2 x (5 x 69,952 + 24 x 70,656) =
    4,091,008."""
    out = profile_update.main([*TINY, "--lora-layers", "1"])
    capsys.readouterr()
    parts = out["parts"]
    assert parts["matmuls"]["flops"] == 6 * BODY_ROWS * LAYER_WEIGHTS == 4_423_680
    assert parts["lora"]["flops"] == LORA / 2
    assert parts["update"]["flops"] == UPDATE / 2 + 4_091_008 == 10_372_480
    assert all(parts[name]["seconds"] > 0 for name in TIMED)
