"""scripts/profile_forward.py times one decoder layer's pieces; its matmul FLOPs are worked out by hand
here."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("profile_forward", ROOT / "scripts" / "profile_forward.py")
profile_forward = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_forward)


def test_every_piece_timed_with_its_flops(capsys, tmp_path):
    out_file = tmp_path / "forward.json"
    profile_forward.main(
        [
            "--preset",
            "tiny",
            "--rows",
            "2",
            "--tokens",
            "8",
            "--repeats",
            "1",
            "--blas",
            "stock",
            "--out",
            str(out_file),
        ]
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out_file.read_text())
    parts = printed["parts"]
    assert set(parts) >= {
        "forward",
        "body",
        "layer",
        "attention",
        "mlp",
        "sdpa",
        "swiglu",
        "head",
        "exp",
        "multiply",
    }
    assert all(p["ms"] > 0 for p in parts.values())
    # The tiny preset: hidden 64, 4 heads of 16, 2 KV heads, intermediate 128, vocabulary 512, 2 layers;
    # 16 positions. A layer's weights: q, o 64 x 64; k, v 64 x 32; gate, up, down 64 x 128: 36,864.
    positions = 2 * 8
    assert parts["layer"]["flops"] == 2 * positions * 36_864
    assert parts["body"]["flops"] == 2 * 2 * positions * 36_864
    assert parts["mlp"]["flops"] == 2 * positions * 3 * 64 * 128
    assert parts["k"]["flops"] == 2 * positions * 64 * 32
    assert parts["head"]["flops"] == 2 * positions * 64 * 512
    # QK^T and AV over all 8 x 8 query-key pairs of each of 4 heads, 16 wide, in each of 2 rows.
    assert parts["sdpa"]["flops"] == 2 * 2 * 2 * 4 * 8 * 8 * 16
    assert printed["elementwise_floats"] == positions * 128
