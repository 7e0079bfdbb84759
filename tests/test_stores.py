"""Models named by their store: Ollama's manifests and blobs, LM Studio's folders (built here in a temp
dir)."""

import json

import pytest

gguf = pytest.importorskip("gguf")

import gguf_files  # noqa: E402
from gguf_files import build_hf_model, numpy_weights, train_bpe, write_gguf  # noqa: E402

from mlx_grpo.models.loading import load_policy, resolve_model_path  # noqa: E402
from mlx_grpo.models.stores import OLLAMA_MODEL_LAYER, StoreError, installed_lmstudio, installed_ollama  # noqa: E402

pytestmark = pytest.mark.usefixtures("gguf_cache")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gguf")
    bpe = train_bpe()
    config = build_hf_model(folder / "hf", "qwen2", len(bpe["tokens"]))
    return write_gguf(folder / "tiny.gguf", config, numpy_weights(folder / "hf"), bpe)


def ollama_store(
    root, model_file, name="qwen2.5", tag="0.5b", namespace="library", host="registry.ollama.ai"
):
    digest = "0123456789abcdef" * 4
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(model_file.read_bytes())
    manifest = root / "manifests" / host / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "layers": [
                    {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "f" * 64},
                    {"mediaType": OLLAMA_MODEL_LAYER, "digest": f"sha256:{digest}"},
                ],
            }
        )
    )
    return root / "blobs" / f"sha256-{digest}"


def test_ollama_names_resolve_and_load(tmp_path, monkeypatch, model_file):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    blob = ollama_store(tmp_path / "ollama", model_file)
    ollama_store(tmp_path / "ollama", model_file, name="smollm2", tag="latest")
    ollama_store(tmp_path / "ollama", model_file, name="mine", namespace="me")
    assert resolve_model_path("ollama:qwen2.5:0.5b") == str(blob)
    assert resolve_model_path("ollama:smollm2") == str(blob)  # tag: latest
    assert resolve_model_path("ollama:me/mine:0.5b") == str(blob)
    assert installed_ollama() == ["ollama:me/mine:0.5b", "ollama:qwen2.5:0.5b", "ollama:smollm2:latest"]
    model, tokenizer = load_policy("ollama:qwen2.5:0.5b")  # a blob has no .gguf suffix: still read as GGUF
    assert model.model_type == "qwen2" and tokenizer.encode("hello")


def test_ollama_errors_are_one_line(tmp_path, monkeypatch, model_file):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    with pytest.raises(StoreError, match=r"no Ollama store at .* \(set OLLAMA_MODELS"):
        resolve_model_path("ollama:qwen2.5")
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    blob = ollama_store(tmp_path / "ollama", model_file)
    with pytest.raises(
        StoreError,
        match=r"ollama:llama3 is not in the Ollama store .*installed: "
        r"ollama:qwen2.5:0.5b\); get it with: ollama pull llama3",
    ):
        resolve_model_path("ollama:llama3")
    blob.unlink()
    with pytest.raises(StoreError, match="points at .*sha256-0123.* which is missing"):
        resolve_model_path("ollama:qwen2.5:0.5b")
    manifest = tmp_path / "ollama" / "manifests" / "registry.ollama.ai" / "library" / "qwen2.5" / "0.5b"
    manifest.write_text("{not json")
    with pytest.raises(StoreError, match="names no model layer"):
        resolve_model_path("ollama:qwen2.5:0.5b")
    assert not (tmp_path / "cache" / "gguf").exists()


def test_lmstudio_names(tmp_path, monkeypatch, model_file):
    root = tmp_path / "lms"
    monkeypatch.setenv("LMSTUDIO_MODELS", str(root))
    one = root / "lmstudio-community" / "Qwen2.5-0.5B-Instruct-GGUF"
    one.mkdir(parents=True)
    (one / "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf").write_bytes(model_file.read_bytes())
    (one / "mmproj-model-f16.gguf").write_bytes(b"GGUF")  # a vision projector, not a model
    two = root / "bartowski" / "SmolLM2-GGUF"
    two.mkdir(parents=True)
    for quant in ("Q4_K_M", "Q8_0"):
        (two / f"SmolLM2-{quant}.gguf").write_bytes(model_file.read_bytes())
    assert resolve_model_path("lmstudio:lmstudio-community/Qwen2.5-0.5B-Instruct-GGUF").endswith(
        "Q4_K_M.gguf"
    )
    assert resolve_model_path("lmstudio:bartowski/SmolLM2-GGUF/SmolLM2-Q8_0.gguf").endswith(
        "SmolLM2-Q8_0.gguf"
    )
    assert resolve_model_path("lmstudio:bartowski/SmolLM2-GGUF/SmolLM2-Q8_0").endswith("SmolLM2-Q8_0.gguf")
    with pytest.raises(StoreError, match="holds 2 model files; name one"):
        resolve_model_path("lmstudio:bartowski/SmolLM2-GGUF")
    with pytest.raises(StoreError, match="has no file nope.gguf"):
        resolve_model_path("lmstudio:bartowski/SmolLM2-GGUF/nope.gguf")
    with pytest.raises(
        StoreError,
        match=r"not in the LM Studio folder .*installed: lmstudio:bartowski/SmolLM2-GGUF, "
        r"lmstudio:lmstudio-community/Qwen2.5-0.5B-Instruct-GGUF",
    ):
        resolve_model_path("lmstudio:someone/Else")
    assert installed_lmstudio() == [
        "lmstudio:bartowski/SmolLM2-GGUF",
        "lmstudio:lmstudio-community/Qwen2.5-0.5B-Instruct-GGUF",
    ]
    model, _ = load_policy("lmstudio:lmstudio-community/Qwen2.5-0.5B-Instruct-GGUF")
    assert model.model_type == "qwen2"


def test_a_store_name_is_read_for_its_chat_template(tmp_path, monkeypatch, model_file):
    """Settings are chosen from the file a name stands for: a template-less file in a store is a base
    model."""
    from mlx_grpo.models.model_info import has_chat_template
    from mlx_grpo.tasks.registry import is_base_model, recommended_settings

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("LMSTUDIO_MODELS", str(tmp_path / "lms"))
    ollama_store(tmp_path / "ollama", model_file)
    monkeypatch.setattr(gguf_files, "CHAT_TEMPLATE", "")  # a pretrained model's file: no template
    config = build_hf_model(tmp_path / "hf", "qwen2", len(train_bpe()["tokens"]))
    folder = tmp_path / "lms" / "someone" / "Base-GGUF"
    folder.mkdir(parents=True)
    write_gguf(folder / "base-f32.gguf", config, numpy_weights(tmp_path / "hf"), train_bpe())
    assert has_chat_template("ollama:qwen2.5:0.5b") and not is_base_model("ollama:qwen2.5:0.5b")
    assert not has_chat_template("lmstudio:someone/Base-GGUF") and is_base_model("lmstudio:someone/Base-GGUF")
    assert recommended_settings("arith", "lmstudio:someone/Base-GGUF")["stop"] == ["\n"]
    assert has_chat_template(
        "ollama:llama3"
    )  # not there: unknown counts as chat; the load says what is missing


def test_every_command_takes_a_store_name(tmp_path, monkeypatch, model_file):
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    ollama_store(tmp_path / "ollama", model_file)
    runner = CliRunner()
    run = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "train",
            "--model",
            "ollama:qwen2.5:0.5b",
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
    for command in (
        ["eval", "--model", "ollama:qwen2.5:0.5b", "--n", "2", "--max-tokens", "4"],
        ["compare", "--base", "ollama:qwen2.5:0.5b", "--trained", str(run), "--n", "2", "--max-tokens", "4"],
    ):
        result = runner.invoke(app, command)
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["eval", "--model", "ollama:llama3", "--n", "2"])
    assert result.exit_code != 0 and "ollama:llama3 is not in the Ollama store" in result.output
    assert "Traceback" not in result.output
