"""What a sandboxed run may use (Limits) and gives back (Result), what this machine lets the
sandbox enforce (a fresh uid, network and PID namespaces), and the rlimits and environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache

from .uids import _mapped_uid_range

MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU, soft = hard: then SIGKILL)
    wall_s: float = 10.0  # wall-clock seconds, then the whole process group is killed
    memory_mb: int = 1024  # address space (RLIMIT_AS)
    file_mb: int = 16  # largest file the program may write (RLIMIT_FSIZE)
    processes: int = 32  # processes/threads of the sandbox uid (RLIMIT_NPROC)
    open_files: int = 64  # file descriptors (RLIMIT_NOFILE)
    output_bytes: int = 65536  # stdout and stderr kept, each; more stops the program


@dataclass
class Result:
    returncode: int | None  # negative: killed by that signal; None: never started
    stdout: str
    stderr: str
    timed_out: bool = False  # killed at the wall-clock limit
    output_capped: bool = False  # killed for writing more than output_bytes
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_capped


def _own_process_count() -> int | None:
    """Processes of this uid (Linux /proc); None where it cannot be counted (macOS)."""
    if not os.path.isdir("/proc"):
        return None
    uid = os.getuid()
    count = 0
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                count += 1
        except OSError:
            pass
    return count


def _rlimits(limits: Limits, dropping_uid: bool) -> dict[str, tuple[int, int]]:
    out = {
        # soft = hard: SIGKILL at the limit (a PID namespace's init ignores SIGXCPU).
        "RLIMIT_CPU": (limits.cpu_s, limits.cpu_s),
        "RLIMIT_AS": (limits.memory_mb * MB, limits.memory_mb * MB),
        "RLIMIT_FSIZE": (limits.file_mb * MB, limits.file_mb * MB),
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_NOFILE": (limits.open_files, limits.open_files),
    }
    # RLIMIT_NPROC counts every process of the real uid: a fresh uid has none,
    # this user has many already (and more may start meanwhile).
    own = 0 if dropping_uid else _own_process_count()
    if own is not None:
        out["RLIMIT_NPROC"] = (own + limits.processes, own + limits.processes)
    return out


def scrubbed_env(directory: str, path: str | None = None) -> dict[str, str]:
    """The whole environment a sandboxed program sees."""
    return {
        "PATH": path or "/usr/local/bin:/usr/bin:/bin",
        "HOME": directory,
        "TMPDIR": directory,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


# ---------------------------------------------------------------------------
# What this machine allows


@dataclass
class Capabilities:
    platform: str
    drop_uid: bool  # root: programs run as a fresh unprivileged uid
    namespaces: bool  # a new network + PID namespace per run
    util_linux: bool  # unshare/setpriv/prlimit fast path
    notes: list[str] = field(default_factory=list)


def _run_quiet(argv: list[str]) -> bool:
    try:
        return (
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def _namespace_prefix() -> list[str]:
    # --kill-child: if unshare itself dies, its child (the PID namespace's
    # init) is killed, and with it everything in the namespace. Not root: a
    # user namespace first, where unprivileged ones are allowed.
    prefix = ["unshare", "--net", "--pid", "--fork", "--kill-child"]
    return prefix if os.geteuid() == 0 else [prefix[0], "--map-root-user", *prefix[1:]]


@lru_cache(maxsize=1)
def capabilities() -> Capabilities:
    """What this machine lets the sandbox enforce (probed once)."""
    linux = sys.platform.startswith("linux")
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    util_linux = linux and all(shutil.which(t) for t in ("unshare", "setpriv", "prlimit"))
    namespaces = util_linux and _run_quiet([*_namespace_prefix(), "true"])
    drop_uid = root
    if root and util_linux:  # a container may lack CAP_SETUID
        uid = _mapped_uid_range()[0]
        drop_uid = _run_quiet(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", "true"])
    notes = []
    if not drop_uid:
        notes.append(
            "programs run as this user (not root, or no CAP_SETUID): files outside the directory "
            "are not protected"
        )
    if not namespaces:
        notes.append("no network/PID namespaces here: programs can open sockets")
    return Capabilities(sys.platform, drop_uid, namespaces, util_linux, notes)
