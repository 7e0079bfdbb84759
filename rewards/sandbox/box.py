"""The Sandbox: a temporary directory where untrusted programs run under limits, removed on close."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from .launch import _collect, _command, _kill_group
from .limits import Capabilities, Limits, Result, capabilities, scrubbed_env
from .uids import _release_uid, _rmtree, _take_uid, _world_writable_dirs, kill_uid, remove_files_of


def _traversable_by_others(path: str) -> bool:
    path = os.path.abspath(path)
    while True:
        try:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        if path == os.path.dirname(path):
            return True
        path = os.path.dirname(path)


def _parent_dir(dropping_uid: bool) -> str | None:
    """Where sandboxes go: the temp dir, or one the sandbox uid can reach by absolute path."""
    if not dropping_uid:
        return None
    for candidate in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(candidate) and _traversable_by_others(candidate):
            return candidate
    return None


class Sandbox:
    """A temporary directory in which untrusted programs run under limits; removed on close."""

    def __init__(
        self,
        limits: Limits | None = None,
        path: str | None = None,
        prefix: str = "sandbox-",
        caps: Capabilities | None = None,
    ):
        """``path``: PATH for the programs; ``caps``: to use less than the machine allows (tests)."""
        self.limits = limits or Limits()
        self.caps = caps or capabilities()
        self.path_env = path
        self.uid = _take_uid() if self.caps.drop_uid else None
        self.dir = tempfile.mkdtemp(prefix=prefix, dir=_parent_dir(self.uid is not None))
        if self.uid is not None:
            os.chown(self.dir, self.uid, self.uid)
        self.closed = False
        self._swept = True  # no process of the uid can exist yet

    def write(self, name: str, text: str) -> Path:
        """Write a file into the directory (readable by the sandboxed uid)."""
        path = Path(self.dir) / name
        path.write_text(text, encoding="utf-8")
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)
        return path

    def run(self, argv: list[str], limits: Limits | None = None) -> Result:
        """Run ``argv`` in the directory under the limits; never raises for the program's sake."""
        if self.closed:
            raise RuntimeError("sandbox is closed")
        limits = limits or self.limits
        start = time.monotonic()
        self._swept = False
        try:
            proc = subprocess.Popen(
                _command(argv, limits, self.uid, self.caps),
                cwd=self.dir,
                env=scrubbed_env(self.dir, self.path_env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            return Result(None, "", f"could not start {argv[0]}: {e}", seconds=time.monotonic() - start)
        try:
            out, err, timed_out, capped = _collect(proc, limits, start)
        finally:
            _kill_group(proc.pid)
            proc.stdout.close()
            proc.stderr.close()
            returncode = proc.wait()
            # In a PID namespace the kernel has already killed everything the
            # program started (its init, our child, has exited): no sweep needed.
            if self.uid is not None and not self.caps.namespaces:
                kill_uid(self.uid)
                self._swept = True
        return Result(
            returncode,
            out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
            timed_out,
            capped,
            time.monotonic() - start,
        )

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.uid is not None:
            if not self._swept:
                kill_uid(self.uid)
            for top in _world_writable_dirs():
                remove_files_of(self.uid, top)
            _release_uid(self.uid)
        _rmtree(self.dir)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_once(argv: list[str], files: dict[str, str] | None = None, limits: Limits | None = None) -> Result:
    """Write ``files`` into a fresh sandbox, run ``argv`` there, remove everything."""
    with Sandbox(limits) as box:
        for name, text in (files or {}).items():
            box.write(name, text)
        return box.run(argv)
