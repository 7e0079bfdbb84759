"""scripts/bench.py runs a small workload and reports what it promises; the OpenBLAS preload's rules."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mlx_grpo import blas
from mlx_grpo.models.random_model import build_random_model

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _script("bench")
bench_variants = _script("bench_variants")  # the patches: stops_ignored
bench_workload = _script("bench_workload")  # the workload: the reward, the FLOPs

TRAINER_KEYS = {
    "step_s",
    "rollout_s",
    "update_s",
    "rollout_tokens_per_s",
    "train_tokens_per_s",
    "peak_memory_gb",
    "achieved_gflops",
    "achieved_frac_of_peak",
    "rewards",
    "reward_first",
    "reward_last",
}
SMALL = [
    "--steps",
    "2",
    "--warmup",
    "1",
    "--max-tokens",
    "6",
    "--prompts",
    "2",
    "--group-size",
    "2",
    "--blas",
    "stock",
]


def test_bench_prints_the_promised_json(capsys, tmp_path):
    out_file = tmp_path / "bench.json"
    bench.main([*SMALL, "--peer", "off", "--out", str(out_file)])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out_file.read_text())
    assert TRAINER_KEYS <= set(printed["mlx_grpo"])
    assert "mlx_lm_lora" not in printed and "speedup" not in printed
    ours = printed["mlx_grpo"]
    assert len(ours["rewards"]) == 2 and ours["steps_timed"] == 1
    assert 0 < ours["rollout_s"] < ours["step_s"]
    assert ours["peak_memory_gb"] > 0 and printed["matmul_peak_gflops"] > 0
    assert 0 < ours["achieved_frac_of_peak"]
    assert printed["workload"]["vocab"] == 512 and printed["blas"] in ("openblas", "reference", "platform")


def test_bench_runs_the_peer_side_by_side(capsys):
    pytest.importorskip("mlx_lm_lora")
    bench.main([*SMALL, "--peer", "auto"])
    printed = json.loads(capsys.readouterr().out)
    assert TRAINER_KEYS <= set(printed["mlx_lm_lora"])
    assert printed["speedup"] == pytest.approx(
        printed["mlx_lm_lora"]["step_s"] / printed["mlx_grpo"]["step_s"]
    )


def test_forward_flops_by_hand():
    shape = dict(hidden=8, layers=1, heads=2, kv_heads=1, intermediate=16, vocab=10)
    # head_dim 4, kv width 4: q,o 2*64 + k,v 2*32 + mlp 3*128 = 576 weights, head 80; attention 2*8*context.
    assert bench_workload.forward_flops(shape, tokens=3, context=5) == 2 * 3 * (576 + 80 + 2 * 8 * 5)


def test_random_model_has_the_asked_vocabulary(tmp_path):
    from mlx_grpo.models.loading import load_policy

    folder = build_random_model(
        tmp_path / "m", hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, vocab=300
    )
    model, tokenizer = load_policy(str(folder))
    assert model.model.embed_tokens.weight.shape == (300, 16)
    assert len(tokenizer.get_vocab()) == 300
    assert isinstance(tokenizer.decode([299, 298, 5]), str)  # multi-byte tokens decode
    assert tokenizer.decode(tokenizer.encode("hello, wörld")) == "hello, wörld"


def test_letter_share_reward():
    assert bench_workload.letter_share(["p", "p"], ["ab1!", ""]) == [0.5, 0.0]


def test_openblas_preload_rules(monkeypatch, tmp_path):
    library = tmp_path / "libblas.so.3"
    library.write_bytes(b"")
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(blas, "on_cpu", lambda: True)
    monkeypatch.delenv(blas._DONE, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/other.so")

    monkeypatch.setenv(blas.ENV, str(library))
    argv, env = blas.preload_command(["-m", "mlx_grpo.cli", "train"])
    assert argv == [sys.executable, "-m", "mlx_grpo.cli", "train"]
    assert env["LD_PRELOAD"] == f"{library}:/other.so" and env[blas._DONE] == str(library)

    monkeypatch.setenv(blas.ENV, "0")  # the opt-out
    assert blas.preload_command(["x"]) is None
    monkeypatch.setenv(blas.ENV, str(tmp_path / "missing.so"))
    assert blas.preload_command(["x"]) is None
    monkeypatch.setenv(blas.ENV, str(library))
    monkeypatch.setattr(blas, "on_cpu", lambda: False)  # CUDA backend: nothing to do
    assert blas.preload_command(["x"]) is None
    monkeypatch.setattr(blas, "on_cpu", lambda: True)
    monkeypatch.setenv(blas._DONE, str(library))  # already re-executed: never loop
    assert blas.preload_command(["x"]) is None
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.delenv(blas._DONE)
    assert blas.preload_command(["x"]) is None


def test_reexecuted_process_hides_the_preload_from_its_children(monkeypatch):
    monkeypatch.setenv(blas._DONE, "/lib/openblas.so")
    monkeypatch.setenv("LD_PRELOAD", "/lib/openblas.so:/other.so")
    blas.use_openblas()  # must not exec: it already did
    import os

    assert os.environ["LD_PRELOAD"] == "/other.so" and blas._DONE not in os.environ


def test_synthetic_rollouts_give_max_length_completions(capsys):
    bench.main([*SMALL, "--peer", "off", "--synthetic-rollouts"])
    ours = json.loads(capsys.readouterr().out)["mlx_grpo"]
    assert ours["mean_completion_tokens"] == 6.0 and ours["rollout_gflops"] == 0.0


def test_every_variant_runs_and_samples_what_ours_samples(capsys):
    """Each variant patches a named internal: a rename must fail here, not silently measure nothing.
    None changes what is sampled, so the first step's reward is ours exactly."""
    bench.main([*SMALL, "--peer", "off", "--variants", "all"])
    printed = json.loads(capsys.readouterr().out)
    for name in bench.VARIANTS:
        assert printed[name]["step_s_vs_ours"] > 0
        assert printed[name]["rewards"][0] == pytest.approx(printed["mlx_grpo"]["rewards"][0], abs=1e-9), name


def test_no_stop_decodes_every_completion_to_max_tokens_in_both_samplers(tmp_path):
    """The end token is made the one greedy decoding emits first: both samplers stop at once,
    and under stops_ignored both run to max_tokens, and the tokenizer gets its end tokens back."""
    from mlx_grpo.models.loading import load_policy
    from mlx_grpo.sampling.rollout import SamplingConfig, sample_completions

    folder = build_random_model(
        tmp_path / "m", hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, vocab=300
    )
    model, tokenizer = load_policy(str(folder))
    prompt = tokenizer.encode("hello there")
    greedy = SamplingConfig(temperature=0.0, max_tokens=5)
    tokenizer.eos_token_ids = {sample_completions(model, tokenizer, [prompt], 1, greedy)[0].tokens[0]}

    def ours():
        return [len(c.tokens) for c in sample_completions(model, tokenizer, [prompt], 2, greedy)]

    assert ours() == [1, 1]
    with bench_variants.stops_ignored(tokenizer):
        assert ours() == [5, 5]
    assert ours() == [1, 1] and len(tokenizer.eos_token_ids) == 1

    pytest.importorskip("mlx_lm_lora")
    from mlx_lm_lora.trainer.grpo_trainer import generate_grpo

    def theirs():
        completions, _, _ = generate_grpo(
            model, tokenizer, [prompt], 5, 2, 1, end_token="", temperature=0.0, top_p=1.0, top_k=0, min_p=0.0
        )
        return [c.size for c in completions]

    assert theirs() == [1, 1]
    with bench_variants.stops_ignored(tokenizer):
        assert theirs() == [5, 5]


def test_per_token_figures_and_the_table(capsys):
    bench.main([*SMALL, "--peer", "off", "--no-stop"])
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    ours = printed["mlx_grpo"]
    assert ours["mean_completion_tokens"] == 6.0 and printed["workload"]["no_stop"]
    # one timed step of 2 prompts x 2 completions x 6 tokens
    assert ours["step_s_per_1k_tokens"] == pytest.approx(1000 * ours["step_s"] / 24)
    assert ours["train_tokens_per_s"] == pytest.approx(24 / ours["update_s"])
    assert ours["peak_memory_gb"] == max(ours["rollout_peak_memory_gb"], ours["update_peak_memory_gb"]) > 0
    assert len(printed["load_average"]["start"]) == 3
    assert f"| mlx_grpo | {ours['step_s']:.2f} |" in captured.err


def test_dequantized_copy_computes_what_the_quantized_model_does(tmp_path, cpu_device):
    # The CPU's case, which the copy is for: there load_policy widens the quantized model to float32 as well.
    import mlx.core as mx

    from mlx_grpo.models.loading import load_policy

    quantized = build_random_model(
        tmp_path / "q", hidden=64, layers=1, heads=2, kv_heads=1, intermediate=128, vocab=300, bits=4
    )
    widened = bench_workload.dequantized_copy(str(quantized), tmp_path / "f")
    assert "quantization" not in json.loads((Path(widened) / "config.json").read_text())
    assert {v.dtype for v in mx.load(str(Path(widened) / "model.safetensors")).values()} == {mx.float32}
    tokens = mx.array([[5, 17, 42, 7]])
    q_logits = load_policy(str(quantized))[0](tokens)
    f_logits = load_policy(widened)[0](tokens)
    assert mx.allclose(q_logits, f_logits, atol=1e-4).item()
