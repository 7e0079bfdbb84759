"""A fresh, otherwise unused uid per sandbox (root only), and removing what it left behind:
its processes, its files in world-writable places, its directory."""

from __future__ import annotations

import os
import random
import shutil
import signal
import stat
import tempfile
import threading
import time

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


# ---------------------------------------------------------------------------
# Files left behind


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
