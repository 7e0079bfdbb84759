"""Run untrusted programs (model-written code) with limits, for any code-grading task.

    with Sandbox() as box:
        box.write("main.ml", source)
        compiled = box.run(["ocamlc", "-o", "main", "main.ml"])
        result = box.run(["./main"], Limits(cpu_s=2, wall_s=4))

Each Sandbox is a fresh temporary directory, removed on close. Each run:

- starts in its own session and process group (killed as a whole at the end,
  and at once when the wall-clock limit passes or the output cap is reached);
- has limits on CPU seconds, address space, file size and process count, no
  core files, stdin on /dev/null, a scrubbed environment (PATH, HOME and TMPDIR
  pointing at the directory, LANG), and stdout/stderr capped at
  ``output_bytes`` each.

What more can be enforced depends on the machine (``capabilities()`` says):

- As root on Linux (CI, containers) each Sandbox runs its programs as a fresh,
  otherwise unused uid with no supplementary groups and no_new_privs, so the
  program can write only its own directory and world-writable places
  (/tmp, /var/tmp, /dev/shm, ...), cannot gain privileges through set-uid
  binaries, and RLIMIT_NPROC (a per-uid count) really bounds a fork bomb.
  After each run every process of that uid is killed, and on close every file
  it owns in a world-writable directory is deleted.
- With CLONE_NEWNET/NEWPID allowed (root, or unprivileged user namespaces),
  each run gets its own network namespace (only a downed loopback: no network)
  and PID namespace (when the run ends the kernel kills every process in it,
  even ones that left the process group).
- As an ordinary user the program runs as you: writes outside the directory
  cannot be prevented, and the process limit counts all your processes (it is
  set to your current count plus ``processes``). macOS has no namespaces and
  ignores the address-space limit; the wall clock and CPU limits still hold.

On Linux the limits are applied by util-linux's ``unshare``, ``setpriv`` and
``prlimit`` (a few ms); elsewhere a short Python launcher does the same job.
Neither needs ``preexec_fn``, so runs may be started from many threads.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

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


@dataclass
class Capabilities:
    platform: str
    drop_uid: bool  # root: programs run as a fresh unprivileged uid
    namespaces: bool  # a new network + PID namespace per run
    util_linux: bool  # unshare/setpriv/prlimit fast path
    notes: list[str] = field(default_factory=list)


def _run_quiet(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=10).returncode == 0
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
        notes.append("programs run as this user (not root, or no CAP_SETUID): files outside the directory "
                     "are not protected")
    if not namespaces:
        notes.append("no network/PID namespaces here: programs can open sockets")
    return Capabilities(sys.platform, drop_uid, namespaces, util_linux, notes)


# ---------------------------------------------------------------------------
# Fresh uids (root only)

_uids_in_use: set[int] = set()
_uid_lock = threading.Lock()


def _mapped_uid_range() -> tuple[int, int]:
    """A range of uids usable here: high ones, inside this user namespace's map."""
    lo, hi = 1_000_000, 2_000_000_000
    try:
        ranges = []
        for path in ("/proc/self/uid_map", "/proc/self/gid_map"):
            with open(path) as f:
                ranges.append([tuple(map(int, line.split())) for line in f if line.strip()])
        # Keep to the first range of each map: enough for containers and plain hosts.
        (u_in, _, u_count), (g_in, _, g_count) = ranges[0][0], ranges[1][0]
        top = min(u_in + u_count, g_in + g_count) - 1
        if top < hi:
            hi = top - 1  # stay clear of the overflow id 65534 and below the top
            lo = max(min(u_in, g_in) + 1000, hi // 2)
    except (OSError, ValueError, IndexError):
        pass
    return lo, hi


def _take_uid() -> int:
    lo, hi = _mapped_uid_range()
    with _uid_lock:
        while True:
            uid = random.randrange(lo, hi)
            if uid not in _uids_in_use and uid != 65534:
                _uids_in_use.add(uid)
                return uid


def _release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


def processes_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose real or effective uid is ``uid`` (Linux /proc)."""
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                text = f.read()
        except OSError:
            continue  # gone meanwhile
        uids, state = None, ""
        for line in text.splitlines():
            if line.startswith("State:"):
                state = line.split()[1]
            elif line.startswith("Uid:"):
                uids = line.split()[1:3]
                break
        if uids and str(uid) in uids and state not in ("Z", "X"):
            pids.append(int(name))
    return pids


def kill_uid(uid: int, rounds: int = 50) -> None:
    """Kill every process of ``uid``: stop them all first so none can fork meanwhile."""
    for _ in range(rounds):
        pids = processes_of(uid)
        if not pids:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        time.sleep(0.002)


def _world_writable_dirs() -> list[str]:
    places = {"/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", tempfile.gettempdir()}
    return sorted(p for p in places if os.path.isdir(p) and not os.path.islink(p))


def remove_files_of(uid: int, top: str, depth: int = 4) -> list[str]:
    """Delete what ``uid`` owns under world-writable directories below ``top``; returns the paths.

    An unprivileged uid can only create entries in directories writable by
    all, so those are the only ones searched (down to ``depth`` levels).
    """
    removed = []
    try:
        entries = list(os.scandir(top))
    except OSError:
        return removed
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == uid:
            _remove(entry.path)
            removed.append(entry.path)
        elif depth > 0 and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
            removed += remove_files_of(uid, entry.path, depth - 1)
    return removed


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            _rmtree(path)
        else:
            os.unlink(path)
    except OSError:
        pass


def _rmtree(path: str) -> None:
    """rmtree that also removes directories a program left unreadable (chmod 000).

    Only directories inside ``path`` are ever chmod-ed, never ``path``'s parent.
    """
    def fix(func, failed, _exc):
        failed = os.path.abspath(failed)
        if failed == os.path.abspath(path) or not failed.startswith(os.path.abspath(path) + os.sep):
            return
        try:
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.chmod(os.path.dirname(failed), 0o700)
                os.unlink(failed)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)
    if os.path.exists(path):  # a second pass once inner directories are readable again
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------
# Launching


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


def _command(argv: list[str], limits: Limits, uid: int | None, caps: Capabilities) -> list[str]:
    rl = _rlimits(limits, uid is not None)
    if not caps.util_linux:
        spec = {"argv": argv, "uid": uid, "limits": rl}
        return [sys.executable, "-S", "-I", "-c", _LAUNCHER, json.dumps(spec)]
    flags = {"RLIMIT_CPU": "cpu", "RLIMIT_AS": "as", "RLIMIT_FSIZE": "fsize", "RLIMIT_CORE": "core",
             "RLIMIT_NOFILE": "nofile", "RLIMIT_NPROC": "nproc"}
    command = ["prlimit", *(f"--{flags[k]}={s}:{h}" for k, (s, h) in rl.items()), "--", *argv]
    if uid is not None:
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--", *command]
    if caps.namespaces:
        command = [*_namespace_prefix(), "--", *command]
    return command


def scrubbed_env(directory: str, path: str | None = None) -> dict[str, str]:
    """The whole environment a sandboxed program sees."""
    return {
        "PATH": path or "/usr/local/bin:/usr/bin:/bin",
        "HOME": directory,
        "TMPDIR": directory,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


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
                chunks[key.fileobj].append(data[:max(room, 0)])
                sizes[key.fileobj] += len(data)
                if sizes[key.fileobj] > limits.output_bytes:
                    capped = True
            if capped:
                break
    return b"".join(chunks[proc.stdout]), b"".join(chunks[proc.stderr]), timed_out, capped


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

    def __init__(self, limits: Limits | None = None, path: str | None = None, prefix: str = "sandbox-",
                 caps: Capabilities | None = None):
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
                _command(argv, limits, self.uid, self.caps), cwd=self.dir,
                env=scrubbed_env(self.dir, self.path_env), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
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
        return Result(returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                      timed_out, capped, time.monotonic() - start)

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


__all__ = ["Capabilities", "Limits", "Result", "Sandbox", "capabilities", "kill_uid", "processes_of",
           "remove_files_of", "run_once", "scrubbed_env"]
