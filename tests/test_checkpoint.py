"""Checkpoints: atomic, checksummed, pruned (keep-last-N, keep-best), and a
damaged one is never loaded: resume falls back to the newest intact one."""

import hashlib
import json

import mlx.core as mx
import numpy as np
import pytest

from mlx_grpo.run import checkpoint as ckpt
from mlx_grpo.run.checkpoint import CheckpointError


def save(run_dir, step, value=None, **kw):
    value = float(step) if value is None else value
    weights = {"layer.lora_a": mx.full((4, 3), value), "layer.lora_b": mx.arange(6, dtype=mx.float32) * value}
    opt_state = {"step": mx.array(step), "layer": {"lora_a": {"m": mx.full((4, 3), value / 2)}}}
    return ckpt.save_checkpoint(
        run_dir, step, weights, {"rank": 4}, opt_state, {"data_position": step * 2}, **kw
    )


def test_round_trip_and_manifest_checksums(tmp_path):
    folder = save(tmp_path, 3)
    assert folder.name == "step_000003"
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000003"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(manifest["files"]) == {
        "adapters.safetensors",
        "optimizer.safetensors",
        "state.json",
        "adapter_config.json",
    }
    for name, entry in manifest["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    weights, opt_state, state = ckpt.load_checkpoint(folder)
    np.testing.assert_array_equal(np.array(weights["layer.lora_b"]), np.arange(6) * 3.0)
    np.testing.assert_array_equal(np.array(opt_state["layer"]["lora_a"]["m"]), np.full((4, 3), 1.5))
    assert state["step"] == 3 and state["data_position"] == 6
    assert not list((tmp_path / "checkpoints").glob(".*"))  # no temporary left behind


def flip_one_byte(path, offset=-3):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_flipped_byte_is_detected_and_resume_falls_back(tmp_path):
    save(tmp_path, 2)
    newest = save(tmp_path, 4)
    flip_one_byte(newest / "optimizer.safetensors")
    with pytest.raises(CheckpointError, match="optimizer.safetensors does not match its sha256"):
        ckpt.load_checkpoint(newest)
    weights, _, state, warnings = ckpt.load_latest(tmp_path)
    assert state["step"] == 2
    np.testing.assert_array_equal(np.array(weights["layer.lora_a"]), np.full((4, 3), 2.0))
    assert len(warnings) == 1
    assert "step_000004" in warnings[0] and "resuming from step_000002 instead" in warnings[0]
    # the damaged one is moved aside (kept for a look) so the run can write step 4 again
    assert (tmp_path / "checkpoints" / "corrupt-step_000004").is_dir()
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000002"


def test_a_truncated_file_is_reported_by_size(tmp_path):
    folder = save(tmp_path, 1)
    path = folder / "adapters.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:100])
    assert ckpt.verify_checkpoint(folder) == f"adapters.safetensors has 100 bytes, expected {size}"
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        ckpt.load_latest(tmp_path)


def test_a_folder_without_manifest_is_never_loaded(tmp_path):
    save(tmp_path, 1)
    # what a writer killed before the manifest leaves (had it been renamed into place)
    half = tmp_path / "checkpoints" / "step_000002"
    half.mkdir()
    (half / "adapters.safetensors").write_bytes(b"partial")
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000001"
    _, _, state, warnings = ckpt.load_latest(tmp_path)
    assert state["step"] == 1 and "manifest.json is missing" in warnings[0]


def test_no_checkpoint_at_all_is_none(tmp_path):
    assert ckpt.load_latest(tmp_path) is None
    assert ckpt.latest_checkpoint(tmp_path) is None


def test_failed_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    save(tmp_path, 1)
    real_save = mx.save_safetensors

    def disk_full(path, arrays, *a, **kw):
        if "optimizer" in str(path):
            real_save(path, arrays)  # a half-written file, as a full disk leaves it
            raise RuntimeError("[write] Unable to write 1234 bytes to file.")
        return real_save(path, arrays, *a, **kw)

    monkeypatch.setattr(ckpt.mx, "save_safetensors", disk_full)
    with pytest.raises(CheckpointError) as err:
        save(tmp_path, 2)
    assert "could not write checkpoint step_000002" in str(err.value)
    assert "the previous checkpoint step_000001 is intact" in str(err.value)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]  # temporary folder removed
    assert (root / "latest").read_text().strip() == "step_000001"
    assert ckpt.verify_checkpoint(root / "step_000001") is None


def test_keep_last_and_keep_best(tmp_path):
    for step, accuracy in [(1, 0.2), (2, 0.9), (3, 0.5), (4, 0.9), (5, None)]:
        save(tmp_path, step, keep_last=1, keep_best=True, metric=accuracy)
    root = tmp_path / "checkpoints"
    # the newest, and the first to reach the best accuracy (0.9 at step 2; step 4 only ties)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002", "step_000005"]
    assert (root / "best").read_text().strip() == "step_000002"
    assert ckpt.best_checkpoint(tmp_path).name == "step_000002"

    plain = tmp_path / "plain"
    for step in range(1, 6):
        save(plain, step, keep_last=3, metric=1.0 if step == 1 else 0.0)
    assert sorted(p.name for p in (plain / "checkpoints").glob("step_*")) == [
        "step_000003",
        "step_000004",
        "step_000005",
    ]
    assert not (plain / "checkpoints" / "best").exists()


def test_saving_the_same_step_again_replaces_it(tmp_path):
    save(tmp_path, 2, value=1.0)
    save(tmp_path, 2, value=5.0)
    weights, _, _, _ = ckpt.load_latest(tmp_path)
    np.testing.assert_array_equal(np.array(weights["layer.lora_a"]), np.full((4, 3), 5.0))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000002"]


def test_truncate_jsonl_drops_later_steps_and_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2}\n{"step": 3}\n{"step": 4, "lo')
    ckpt.truncate_jsonl(path, 2)
    assert path.read_text() == '{"step": 1, "loss": 0.5}\n{"step": 2}\n'


def test_unwritable_output_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match="output folder .* is not writable"):
        ckpt.ensure_writable(blocker / "run")
    ckpt.ensure_writable(tmp_path / "new" / "run")
    assert not (tmp_path / "new").exists()  # the probe and the folders made for it are gone
    ckpt.atomic_write_text(tmp_path / "new" / "run" / "config.yaml", "x")  # the first real write makes them
    ckpt.ensure_writable(tmp_path / "new" / "run")
    assert [p.name for p in (tmp_path / "new" / "run").iterdir()] == ["config.yaml"]
    (tmp_path / "new" / "run" / "config.yaml").unlink()
    # a killed run's half-written temporaries are cleared; real files stay
    (tmp_path / "new" / "run" / ".adapters.tmp-123.safetensors").write_bytes(b"half")
    (tmp_path / "new" / "run" / "metrics.jsonl").write_text("")
    ckpt.ensure_writable(tmp_path / "new" / "run")
    assert [p.name for p in (tmp_path / "new" / "run").iterdir()] == ["metrics.jsonl"]


def test_atomic_writes_clean_up_after_a_failure(tmp_path, monkeypatch):
    def fail(*a, **kw):
        raise RuntimeError("[write] Unable to write")

    monkeypatch.setattr(ckpt.mx, "save_safetensors", fail)
    (tmp_path / "adapters.safetensors").write_bytes(b"previous")
    with pytest.raises(CheckpointError, match="could not write .*adapters.safetensors"):
        ckpt.atomic_save_safetensors(tmp_path / "adapters.safetensors", {"a": mx.zeros(2)})
    assert [p.name for p in tmp_path.iterdir()] == ["adapters.safetensors"]
    assert (tmp_path / "adapters.safetensors").read_bytes() == b"previous"
