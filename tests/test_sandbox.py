"""rewards/sandbox/: limits, cleanup, and hostile programs.

Hostile programs are written in sh (and Python where sh cannot do it), with
tight limits so that a fork bomb cannot disturb a small shared machine.
Containment that needs root (a fresh uid: process count, files outside the
directory) or namespaces (no network) is skipped, with the reason, elsewhere.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import uuid

import pytest

from rewards.sandbox import Limits, Sandbox, capabilities, processes_of, run_once

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs a POSIX system")

CAPS = capabilities()
needs_uid = pytest.mark.skipif(
    not CAPS.drop_uid, reason="needs root: programs then run as a fresh unprivileged uid"
)
needs_ns = pytest.mark.skipif(not CAPS.namespaces, reason="network namespaces are not available here")

TIGHT = Limits(cpu_s=1, wall_s=2, memory_mb=256, file_mb=1, processes=8, output_bytes=4096)

# The ways this machine can run a sandbox: the best it allows, then without namespaces
# (containers without CAP_SYS_ADMIN), then the portable Python launcher (macOS).
MODES = {
    "best": CAPS,
    "no-namespaces": dataclasses.replace(CAPS, namespaces=False),
    "launcher": dataclasses.replace(CAPS, namespaces=False, util_linux=False),
}


@pytest.fixture(
    params=[m for m in MODES if m == "best" or CAPS.util_linux and (m != "no-namespaces" or CAPS.namespaces)]
)
def caps(request):
    return MODES[request.param]


@pytest.fixture(scope="module")
def python():
    """A Python the sandboxed uid may run (the venv's may sit under a private home)."""
    for candidate in (sys.executable, "/usr/bin/python3", shutil.which("python3")):
        if (
            candidate
            and run_once([candidate, "-c", "print('ok')"], limits=Limits(wall_s=10)).stdout == "ok\n"
        ):
            return candidate
    pytest.skip("no Python that the sandboxed uid can run")


def test_runs_in_its_own_directory_with_a_scrubbed_environment():
    os.environ["MLX_GRPO_SECRET_FOR_TEST"] = "leak"
    try:
        with Sandbox(TIGHT) as box:
            box.write("in.txt", "hello")
            result = box.run(["sh", "-c", "cat in.txt; echo; pwd; env | sort; cat"])
            directory = box.dir
    finally:
        del os.environ["MLX_GRPO_SECRET_FOR_TEST"]
    assert result.ok, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "hello" and lines[1] == directory
    names = {line.split("=", 1)[0] for line in lines[2:] if "=" in line}
    assert "MLX_GRPO_SECRET_FOR_TEST" not in names
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PWD", "SHLVL", "_"}
    assert not os.path.exists(directory)  # removed on close


def test_exit_status_and_stderr_are_reported():
    result = run_once(["sh", "-c", "echo oops >&2; exit 3"], limits=TIGHT)
    assert result.returncode == 3 and result.stderr == "oops\n" and not result.ok


def test_a_missing_program_is_a_result_not_an_exception():
    result = run_once(["/no/such/program"], limits=TIGHT)
    assert not result.ok


def test_infinite_loop_is_killed_at_the_limits(caps):
    with Sandbox(dataclasses.replace(TIGHT, wall_s=1), caps=caps) as box:
        result = box.run(["sh", "-c", "while :; do :; done"])
        uid = box.uid
    assert not result.ok and (result.timed_out or result.returncode != 0)
    if uid is not None:
        assert processes_of(uid) == []


def test_background_processes_do_not_outlive_the_run(caps):
    # setsid leaves the process group: only the uid sweep or the PID namespace can catch it.
    with Sandbox(TIGHT, caps=caps) as box:
        result = box.run(["sh", "-c", "setsid sleep 30 & sleep 30 & echo started"])
        uid = box.uid
    assert result.stdout == "started\n"
    if uid is not None:
        assert processes_of(uid) == []


@needs_uid
def test_fork_bomb_is_contained(caps):
    with Sandbox(TIGHT, caps=caps) as box:
        result = box.run(["sh", "-c", "bomb() { bomb | bomb & }; bomb; sleep 1"])
        uid = box.uid
        assert processes_of(uid) == []  # killed right after the run
    assert "Cannot fork" in result.stderr  # the process limit stopped it


def test_allocating_10_gb_fails(python, caps):
    with Sandbox(TIGHT, caps=caps) as box:
        result = box.run([python, "-c", "x = bytearray(10 * 1024 ** 3); print('allocated')"])
    assert "allocated" not in result.stdout
    assert result.returncode != 0


def test_printing_1_gb_is_cut_at_the_output_cap(caps):
    with Sandbox(TIGHT, caps=caps) as box:
        result = box.run(["sh", "-c", "head -c 1073741824 /dev/zero | tr '\\0' x"])
    assert result.output_capped and not result.ok
    assert len(result.stdout) == TIGHT.output_bytes


def test_writing_a_big_file_hits_the_file_size_limit():
    with Sandbox(TIGHT) as box:
        result = box.run(["sh", "-c", "head -c 5000000 /dev/zero > big; echo done"])
        size = os.path.getsize(os.path.join(box.dir, "big"))
    assert size <= TIGHT.file_mb * 1024 * 1024 < 5000000
    assert "File size limit exceeded" in result.stderr  # head was killed by SIGXFSZ; the shell went on


@needs_uid
def test_files_written_outside_the_directory_do_not_survive(tmp_path, caps):
    tag = uuid.uuid4().hex
    targets = [f"/tmp/escape-{tag}", f"/var/tmp/escape-{tag}/sub/file", f"/dev/shm/escape-{tag}"]
    protected = tmp_path / f"escape-{tag}"  # a root-owned, non-world-writable directory
    script = "; ".join(
        [
            f"echo x > {targets[0]}",
            f"mkdir -p {os.path.dirname(targets[1])} && echo x > {targets[1]}",
            f"echo x > {targets[2]}",
            f"echo x > {protected}",
            f"echo x > {os.getcwd()}/escape-{tag}",
            "true",
        ]
    )
    with Sandbox(TIGHT, caps=caps) as box:
        result = box.run(["sh", "-c", script])
        assert os.path.exists(targets[0]) or not os.access("/tmp", os.W_OK)  # it did write there...
    assert result.returncode == 0
    for path in [*targets, f"/var/tmp/escape-{tag}", str(protected), f"{os.getcwd()}/escape-{tag}"]:
        assert not os.path.exists(path), path  # ...and nothing is left after close
    assert oct(os.stat("/tmp").st_mode & 0o7777) == "0o1777"  # and the shared dirs keep their modes


@needs_ns
def test_no_network(python):
    result = run_once(["sh", "-c", "cat /proc/net/dev"], limits=TIGHT)
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line]
    assert interfaces == ["lo"]
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=1); print('connected')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    result = run_once([python, "-c", code], limits=TIGHT)
    assert result.stdout.startswith("refused"), result.stdout + result.stderr


@needs_uid
def test_runs_as_an_unprivileged_uid_without_new_privileges(caps):
    with Sandbox(TIGHT, caps=caps) as box:
        result = box.run(["sh", "-c", "id -u; grep NoNewPrivs /proc/self/status"])
        uid = box.uid
    first, second = result.stdout.splitlines()
    assert int(first) == uid != 0
    assert second.split() == ["NoNewPrivs:", "1"]
