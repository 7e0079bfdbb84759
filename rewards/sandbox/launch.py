"""Starting a program under its limits, reading its output, and killing its process group."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time

from .limits import Capabilities, Limits, _namespace_prefix, _rlimits

# The portable launcher (no util-linux): set limits, drop to the uid, exec.
_LAUNCHER = """
import json, os, resource, shutil, sys
spec = json.loads(sys.argv[1])
# Resolve the program while this process can still read everything.
program = spec["argv"][0] if "/" in spec["argv"][0] else shutil.which(spec["argv"][0]) or spec["argv"][0]
for name, (soft, hard) in spec["limits"].items():
    try:
        resource.setrlimit(getattr(resource, name), (soft, hard))
    except (ValueError, OSError, AttributeError):
        pass  # e.g. macOS refuses RLIMIT_AS below its current use
try:  # Linux: set-uid binaries cannot raise privileges (PR_SET_NO_NEW_PRIVS)
    import ctypes
    ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)
except (OSError, AttributeError):
    pass
if spec["uid"] is not None:
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
os.execv(program, spec["argv"])
"""


def _command(argv: list[str], limits: Limits, uid: int | None, caps: Capabilities) -> list[str]:
    rl = _rlimits(limits, uid is not None)
    if not caps.util_linux:
        spec = {"argv": argv, "uid": uid, "limits": rl}
        return [sys.executable, "-S", "-I", "-c", _LAUNCHER, json.dumps(spec)]
    flags = {
        "RLIMIT_CPU": "cpu",
        "RLIMIT_AS": "as",
        "RLIMIT_FSIZE": "fsize",
        "RLIMIT_CORE": "core",
        "RLIMIT_NOFILE": "nofile",
        "RLIMIT_NPROC": "nproc",
    }
    command = ["prlimit", *(f"--{flags[k]}={s}:{h}" for k, (s, h) in rl.items()), "--", *argv]
    if uid is not None:
        command = [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--no-new-privs",
            "--",
            *command,
        ]
    if caps.namespaces:
        command = [*_namespace_prefix(), "--", *command]
    return command


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _collect(proc: subprocess.Popen, limits: Limits, start: float) -> tuple[bytes, bytes, bool, bool]:
    """Read stdout/stderr until both close, the wall clock runs out, or too much comes."""
    chunks = {proc.stdout: [], proc.stderr: []}
    sizes = {proc.stdout: 0, proc.stderr: 0}
    timed_out = capped = False
    exited_at = None
    with selectors.DefaultSelector() as sel:
        for pipe in chunks:
            sel.register(pipe, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if now - start >= limits.wall_s:
                timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            # A background process may keep the pipes open after the program
            # exits: give it a moment to flush, then stop listening.
            if exited_at is not None and now - exited_at > 0.2:
                break
            for key, _ in sel.select(timeout=min(0.05, limits.wall_s - (now - start))):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                room = limits.output_bytes - sizes[key.fileobj]
                chunks[key.fileobj].append(data[: max(room, 0)])
                sizes[key.fileobj] += len(data)
                if sizes[key.fileobj] > limits.output_bytes:
                    capped = True
            if capped:
                break
    return b"".join(chunks[proc.stdout]), b"".join(chunks[proc.stderr]), timed_out, capped
