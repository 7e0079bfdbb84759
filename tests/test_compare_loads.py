"""`eval` and `compare` load each model's weights once, to answer: screening a task's rows (run/setup.py's
guard_task) reads the tokenizer and the context length from the model's files (models/screen_info.py),
the very ones a load gives. It holds one model at a time."""

import json
import shutil
from collections import Counter

import mlx_lm.utils
import pytest
from typer.testing import CliRunner

from mlx_grpo.cli import app
from mlx_grpo.config import build_config
from mlx_grpo.models.loading import embedded_model_path, load_policy
from mlx_grpo.models.screen_info import context_length, read_tokenizer
from mlx_grpo.run.trainer import train

TEXTS = ["Tom has 3 pens and buys 4 more.", "  x\n\ny ", "é ünïcode ✓"]
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def _same_tokenizer(read, loaded):
    assert [read.encode(t) for t in TEXTS] == [loaded.encode(t) for t in TEXTS]
    assert read.eos_token_ids == loaded.eos_token_ids
    if loaded.chat_template:
        assert read.apply_chat_template(MESSAGES, add_generation_prompt=True) == loaded.apply_chat_template(
            MESSAGES, add_generation_prompt=True
        )


@pytest.fixture()
def counted_loads(monkeypatch):
    """Every load of a model's weights (mlx-lm's load_model, under load_policy and any other load), by
    folder."""
    loads = Counter()
    real = mlx_lm.utils.load_model

    def counting(model_path, *args, **kwargs):
        loads[str(model_path)] += 1
        return real(model_path, *args, **kwargs)

    monkeypatch.setattr(mlx_lm.utils, "load_model", counting)
    return loads


def test_read_tokenizer_gives_what_a_load_gives_and_loads_no_weights(
    tiny_model_path, tmp_path, counted_loads
):
    # The tiny model's config.json has no max_position_embeddings: the architecture's default (qwen2: 32768),
    # as a load gives it. A copy says 64.
    assert "max_position_embeddings" not in json.loads((tiny_model_path / "config.json").read_text())
    short = tmp_path / "short"
    shutil.copytree(tiny_model_path, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    models = [str(tiny_model_path), str(short)]
    if (embedded_model_path() / "config.json").is_file():
        models.append(None)  # the embedded model: 256
    read = [read_tokenizer(m) for m in models]
    assert not counted_loads  # read from the files alone
    for model, (tokenizer, read_context) in zip(models, read):
        loaded, loaded_tokenizer = load_policy(model, keep_quantized=True)
        assert read_context == context_length(loaded) is not None, model
        _same_tokenizer(tokenizer, loaded_tokenizer)
    assert [context for _, context in read][:2] == [32768, 64]


def test_a_gguf_files_tokenizer_and_context_are_its_loads(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from gguf_files import build_hf_model, numpy_weights, train_bpe, write_gguf

    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path / "cache"))
    bpe = train_bpe()
    config = build_hf_model(tmp_path / "hf", "llama", len(bpe["tokens"]))
    path = str(write_gguf(tmp_path / "tiny.gguf", config, numpy_weights(tmp_path / "hf"), bpe))
    tokenizer, context = read_tokenizer(path)
    loaded, loaded_tokenizer = load_policy(path, keep_quantized=True)
    assert context == context_length(loaded) == config["max_position_embeddings"]
    _same_tokenizer(tokenizer, loaded_tokenizer)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One LoRA step of the tiny model on arith: a run folder to compare."""
    from tiny import build_tiny_model

    folder = tmp_path_factory.mktemp("loads")
    model = build_tiny_model(folder / "model")
    run = folder / "run"
    train(
        build_config(
            {
                "model": str(model),
                "steps": 1,
                "batch_size": 4,
                "group_size": 4,
                "max_tokens": 4,
                "eval_num_problems": 4,
                "output": str(run),
                "task": "arith",
            }
        )
    )
    return run, model


def test_compare_and_eval_load_each_model_once(tiny_run, tmp_path, counted_loads):
    """compare --trained RUN decodes two models on the run's base: its weights are loaded twice, once for
    each (before: three times, a third to screen the rows); eval loads its model once (before: twice)."""
    run, base = tiny_run
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "compare",
            "--trained",
            str(run),
            "--n",
            "4",
            "--no-cache",
            "--no-plot",
            "--output",
            str(tmp_path / "c"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "c" / "report.json").read_text())["n"] == 4
    assert counted_loads == {str(base): 2}
    counted_loads.clear()
    result = runner.invoke(
        app, ["eval", "--model", str(run), "--n", "4", "--no-cache", "--output", str(tmp_path / "e")]
    )
    assert result.exit_code == 0, result.output
    assert counted_loads == {str(base): 1}


def test_compare_lets_go_of_the_base_before_it_loads_the_trained_model(tiny_model_path, monkeypatch):
    """compare holds one model at a time: when the trained model loads, nothing holds the base's weights
    (the compiled decode steps of the base's answers held them until the next decode)."""
    import weakref

    from compare_setup import task_and_settings

    from mlx_grpo.evaluation import compare as cmp

    loaded, alive_at_load = [], []
    real = cmp.load_model

    def recording(spec, keep_quantized=False):
        alive_at_load.append([ref() is not None for ref in loaded])
        model, tokenizer = real(spec, keep_quantized)
        loaded.append(weakref.ref(model))
        return model, tokenizer

    monkeypatch.setattr(cmp, "load_model", recording)
    spec = cmp.ModelSpec(str(tiny_model_path))
    task, settings = task_and_settings(str(tiny_model_path), n=2, max_tokens=4)
    settings.cache = False  # both models decode
    cmp.compare(spec, spec, task, settings)
    assert alive_at_load == [[], [False]]
