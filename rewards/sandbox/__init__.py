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

The modules: ``box`` (the Sandbox and run_once), ``limits`` (Limits, Result, the
rlimits and environment, and ``capabilities()``: what this machine allows),
``launch`` (starting a program, collecting its output, killing its process group)
and ``uids`` (a fresh uid per sandbox, and removing what a run left behind: its
processes and its files).
"""

from .box import Sandbox, run_once
from .limits import Capabilities, Limits, Result, capabilities, scrubbed_env
from .uids import kill_uid, processes_of, remove_files_of

__all__ = [
    "Capabilities",
    "Limits",
    "Result",
    "Sandbox",
    "capabilities",
    "kill_uid",
    "processes_of",
    "remove_files_of",
    "run_once",
    "scrubbed_env",
]
