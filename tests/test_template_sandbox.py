"""A chat template comes from the model file: it renders only in Jinja's sandbox, whatever it tries.

A hostile GGUF template tries to reach Python objects (a class's subclasses,
a function's globals, the os module) to run a command that would create a
file. Rendering it must fail (or render nothing dangerous), create nothing,
and the commands say so in one line.
"""

import pytest

gguf = pytest.importorskip("gguf")

import gguf_files  # noqa: E402
from gguf_files import build_hf_model, numpy_weights, train_bpe, write_gguf  # noqa: E402

from mlx_grpo.models.loading import load_policy  # noqa: E402
from mlx_grpo.tasks.data import DataError, encode_prompt  # noqa: E402

pytestmark = pytest.mark.usefixtures("gguf_cache")

ATTACKS = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}",
    "{{ self.__init__.__globals__.__builtins__.__import__('os').system('touch {marker}') }}",
    "{% for c in ().__class__.__base__.__subclasses__() %}{% if c.__name__ == 'Popen' %}"
    "{{ c(['touch', '{marker}']) }}{% endif %}{% endfor %}",
    "{{ namespace.__init__.__globals__.os.system('touch {marker}') }}",
    "{{ raise_exception.__globals__['__builtins__']['open']('{marker}', 'w') }}",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_hostile_template_runs_nothing(tmp_path, monkeypatch, attack):
    marker = tmp_path / "PWNED"
    bpe = train_bpe()
    config = build_hf_model(tmp_path / "hf", "qwen2", len(bpe["tokens"]))
    monkeypatch.setattr(gguf_files, "CHAT_TEMPLATE", attack.replace("{marker}", str(marker)))
    path = write_gguf(tmp_path / "evil.gguf", config, numpy_weights(tmp_path / "hf"), bpe)
    _, tokenizer = load_policy(str(path))
    assert tokenizer.chat_template == attack.replace(
        "{marker}", str(marker)
    )  # the file's template is the one used
    try:
        ids = encode_prompt(tokenizer, "What is 2+3?")
    except DataError as e:
        assert "chat template cannot render" in str(e) and "\n" not in str(e)
    else:  # rendered: then only as inert text
        assert "Popen" not in tokenizer.decode(ids) and "os" not in tokenizer.decode(ids).split()
    assert not marker.exists()


def test_the_command_says_so_in_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mlx_grpo.cli import app

    marker = tmp_path / "PWNED"
    bpe = train_bpe()
    config = build_hf_model(tmp_path / "hf", "qwen2", len(bpe["tokens"]))
    monkeypatch.setattr(gguf_files, "CHAT_TEMPLATE", ATTACKS[2].replace("{marker}", str(marker)))
    path = write_gguf(tmp_path / "evil.gguf", config, numpy_weights(tmp_path / "hf"), bpe)
    result = CliRunner().invoke(
        app,
        ["train", "--model", str(path), "--task", "arith", "--steps", "1", "--output", str(tmp_path / "run")],
    )
    assert result.exit_code != 0 and "chat template cannot render" in result.output
    assert "Traceback" not in result.output and not marker.exists()
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").glob("*.safetensors"))
