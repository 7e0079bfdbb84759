"""A multithreaded BLAS for MLX's CPU backend on Linux, when one is installed.

The mlx-cpu wheel brings the reference BLAS: single-threaded and unblocked. On
the 2-core test machine OpenBLAS does the same float32 matmuls 3 to 20 times
faster, and a whole GRPO step of a small model runs about 2x faster (numbers in
docs/performance.md). The dynamic loader takes each symbol from the first
library that defines it, so preloading OpenBLAS's `libblas.so.3` puts its
`cblas_sgemm` in front of the wheel's. `LD_PRELOAD` is read only when a
process starts, so the `mlx-grpo` command re-executes itself once with it set.

Which library: `MLX_GRPO_OPENBLAS=/path/to/lib.so` when set; else the system's
OpenBLAS (Debian/Ubuntu: `apt-get install libopenblas0-pthread`); else, on
x86-64, Intel's `libmkl_rt` from the `mkl` wheel (`pip install
'mlx-grpo[fastblas]'`, no root needed), which exports the same CBLAS and LAPACK
names. OpenBLAS comes first because it measured faster: on an AMD EPYC at the
decode's output-head shape (scripts/bench_blas.py), and on an
Intel Xeon over a whole training step with MKL told not to spin (KMP_BLOCKTIME=0,
as preload_command sets it): 116 s against 243 s. With Intel's spinning default
MKL was ahead there (102 s), but a shared machine cannot afford spinning threads
("MKL against OpenBLAS on an Intel Xeon").

It does nothing on macOS (Accelerate), on MLX's CUDA backend, when neither is
installed, or with `MLX_GRPO_OPENBLAS=0`. When the matmuls stay on the reference
BLAS (nothing found, or `MLX_GRPO_OPENBLAS` names a file that is not there), the
command says so once, in one line on stderr, with the fix.

OpenBLAS picks its kernels for the CPU it runs on, but a release older than the
CPU does not know it and falls back, silently, to kernels from before AVX2
(Debian 12's 0.3.21 on Xeons with AMX runs its SSE3 "Prescott" kernels: 53
GFLOP/s where its SkylakeX kernels give 246). So before preloading, the library
is asked which kernels it would use; when those predate AVX2 on a CPU that has
AVX-512 (or AVX2), the command re-executes with `OPENBLAS_CORETYPE` set to the
matching kernels (SkylakeX, or Haswell), checks one matmul against NumPy, and
says one line either way (a disagreement goes back to the library's own choice).
An `OPENBLAS_CORETYPE` already set, by the user or the machine, is never changed.
"""

from __future__ import annotations

import os
import platform
import sys
import sysconfig
from pathlib import Path

from .device import on_cpu

ENV = "MLX_GRPO_OPENBLAS"
_DONE = "MLX_GRPO_OPENBLAS_PRELOADED"  # set in the re-executed process: never loop
CORETYPE = "OPENBLAS_CORETYPE"  # OpenBLAS's own variable: which kernels it loads
_CHOSE = "MLX_GRPO_OPENBLAS_CHOSE"  # in the re-executed process: "version|its own core" when we set CORETYPE
_REJECTED = "MLX_GRPO_OPENBLAS_REJECTED"  # "version|core|ours": our kernels failed the check, theirs are back
# OpenBLAS's x86-64 kernel sets that use neither AVX2 nor AVX-512: what an OpenBLAS older than
# the CPU falls back to. (Sandybridge is AVX without FMA; Haswell, Zen, SkylakeX and later are fine.)
_PRE_AVX2_CORES = {
    "katmai",
    "coppermine",
    "northwood",
    "prescott",
    "banias",
    "atom",
    "core2",
    "penryn",
    "dunnington",
    "nehalem",
    "athlon",
    "opteron",
    "opteron_sse3",
    "barcelona",
    "bobcat",
    "nano",
    "sandybridge",
    "bulldozer",
    "piledriver",
    "steamroller",
}
_AVX512 = {"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"}  # what OpenBLAS's SkylakeX kernels use
_SYSTEM_LIB = Path("/usr/lib")  # where Debian/Ubuntu put OpenBLAS (a variable for the tests)
# Set for MKL unless already set. Intel's OpenMP threads spin 200 ms after each call by default; on a
# small shared CPU that spinning took the cores the next matmul needed (a step 2-3x slower than with 0).
# On an idle Intel Xeon spinning was 12-15% faster a step (docs/performance.md): a user's own choice wins.
MKL_THREADS = {"KMP_BLOCKTIME": "0"}


def blas_path() -> str | None:
    """The BLAS library to preload (see the module docstring), or None."""
    choice = os.environ.get(ENV, "").strip()
    if choice.lower() in ("0", "off", "no", "false"):
        return None
    if choice and choice.lower() not in ("1", "on", "yes", "true"):
        return choice if Path(choice).is_file() else None
    return system_openblas_path() or pip_mkl_path()


def system_openblas_path() -> str | None:
    """The distribution's OpenBLAS (Debian/Ubuntu's `libblas.so.3` alternative), or None."""
    arch = f"{platform.machine()}-linux-gnu"
    for variant in ("openblas-pthread", "openblas-openmp"):
        path = _SYSTEM_LIB / arch / variant / "libblas.so.3"
        if path.is_file():
            return str(path)
    return None


def pip_mkl_path() -> str | None:
    """`libmkl_rt.so.N` as the `mkl` wheel installs it (into the environment's or the user's lib/), or
    None."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None  # Intel's wheels are x86-64 only
    roots = [sysconfig.get_path("data"), sysconfig.get_path("data", f"{os.name}_user")]
    for root in dict.fromkeys(r for r in roots if r):
        found = sorted(Path(root, "lib").glob("libmkl_rt.so.*"))
        if found:
            return str(found[-1])
    return None


def openblas_identity(library: str) -> tuple[str, str] | None:
    """(version, kernels) of the OpenBLAS in `library`, such as ("0.3.21", "Prescott"); None for another BLAS.

    Loading it here starts its threads in this process; the caller is about to exec anyway.
    """
    import ctypes

    try:
        lib = ctypes.CDLL(library)
        config, corename = lib.openblas_get_config, lib.openblas_get_corename
    except (OSError, AttributeError):
        return None
    config.restype = corename.restype = ctypes.c_char_p
    words = (config() or b"").decode(errors="replace").split()
    version = words[1] if len(words) > 1 and words[0] == "OpenBLAS" else "?"
    return version, (corename() or b"?").decode(errors="replace")


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (/proc/cpuinfo), or an empty set."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def better_coretype(core: str, flags: set[str]) -> str | None:
    """The OpenBLAS kernels to ask for instead of `core`, or None when `core` already suits the CPU."""
    if core.lower() not in _PRE_AVX2_CORES:
        return None
    if _AVX512 <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def preload_command(argv: list[str] | None = None) -> tuple[list[str], dict] | None:
    """(argv, environment) to re-execute this process with OpenBLAS preloaded, or None to go on as is."""
    if sys.platform != "linux" or os.environ.get(_DONE):
        return None
    library = blas_path()
    if library is None or library in os.environ.get("LD_PRELOAD", "").split(":"):
        return None
    if not on_cpu():
        return None
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)
    env[_DONE] = library
    if CORETYPE not in env and _REJECTED not in env:
        identity = openblas_identity(library)
        choice = identity and better_coretype(identity[1], cpu_flags())
        if choice:
            env[CORETYPE], env[_CHOSE] = choice, "|".join(identity)
    if Path(library).name.startswith("libmkl"):
        for name, value in MKL_THREADS.items():
            env.setdefault(name, value)
    return [sys.executable, *(argv if argv is not None else sys.orig_argv[1:])], env


def _mapped_files() -> set[str] | None:
    """The files mapped into this process (Linux), or None where /proc/self/maps does not exist."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    return {line.split()[-1] for line in maps.splitlines() if "/" in line}


def _openblas_files(mapped: set[str]) -> list[str]:
    """The OpenBLAS libraries among `mapped` that MLX can use: numpy brings its own (numpy.libs/,
    scipy.libs/), and that one is not MLX's."""
    return sorted(m for m in mapped if "openblas" in m.lower() and ".libs/" not in m)


def loaded_blas() -> str:
    """Which BLAS MLX's CPU matmuls use in this process: "openblas", "mkl", "reference" or "platform"."""
    mapped = _mapped_files()
    if mapped is None:
        return "platform"  # macOS: Accelerate
    if _openblas_files(mapped):
        return "openblas"
    if any(m.rsplit("/", 1)[-1].startswith("libmkl_rt.") for m in mapped):
        return "mkl"
    if any(".libs/libblas" in m for m in mapped):  # the wheel's own (mlx_cpu.libs/, mlx_cuda_13.libs/)
        return "reference"
    return "platform"


_OFF = ("0", "off", "no", "false")
_FIX = (
    "Fix: apt-get install libopenblas0-pthread (Debian/Ubuntu), or pip install 'mlx-grpo[fastblas]' "
    "(x86-64), "
    "or set MLX_GRPO_OPENBLAS to a BLAS library such as OpenBLAS's libblas.so.3"
)


def slow_blas_notice() -> str | None:
    """One line, with the fix, when MLX's CPU matmuls use the mlx wheel's reference BLAS on Linux; else None.

    Nothing when OpenBLAS (or another BLAS) is in use, off Linux, on a GPU
    backend, or when MLX_GRPO_OPENBLAS=0 turned the preload off on purpose.
    """
    choice = os.environ.get(ENV, "").strip()
    if sys.platform != "linux" or choice.lower() in _OFF or not on_cpu() or loaded_blas() != "reference":
        return None
    slow = "MLX's matmuls run on the mlx wheel's reference BLAS (one core, unblocked: 3-10x slower)"
    if choice and choice.lower() not in ("1", "on", "yes", "true") and not Path(choice).is_file():
        return (
            f"warning: {ENV}={choice} is not a file, so {slow}. "
            "Point it at OpenBLAS's libblas.so.3, or unset it."
        )
    return f"warning: no OpenBLAS or MKL found, so {slow}. {_FIX}."


def _warn_if_slow() -> None:
    notice = slow_blas_notice()
    if notice:
        print(notice, file=sys.stderr, flush=True)


def use_openblas() -> None:
    """Re-execute the command with OpenBLAS preloaded when that helps (see the module docstring).

    In the re-executed process, LD_PRELOAD is taken out of the environment again
    so that programs it starts (reward code, compilers) are not affected. When
    the matmuls stay on the reference BLAS, says so once (slow_blas_notice).
    """
    library = os.environ.pop(_DONE, None)
    if library is not None:
        if os.environ.get(_CHOSE):
            _check_chosen_kernels(library)  # may re-execute once more, with the library's own kernels
        preload = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p and p != library]
        if preload:
            os.environ["LD_PRELOAD"] = ":".join(preload)
        else:
            os.environ.pop("LD_PRELOAD", None)
        rejected = os.environ.pop(_REJECTED, None)
        if rejected:
            version, theirs, ours = rejected.split("|")
            print(
                f"OpenBLAS {version}: its {ours} kernels disagreed with NumPy on a matmul check here, so it "
                "runs "
                f"its own choice, {theirs} (slower). Set {CORETYPE} to choose other kernels.",
                file=sys.stderr,
                flush=True,
            )
        _warn_if_slow()  # a library that did not load (another architecture's, say)
        return
    command = preload_command()
    if command is None:
        _warn_if_slow()
        return
    try:
        _exec(*command)
    except OSError:
        _warn_if_slow()  # carry on with the stock BLAS


def matmul_error() -> float:
    """Largest relative error of MLX's CPU float32 matmul against NumPy in float64, over two shapes
    (a small one and one large enough for the BLAS's blocked kernels)."""
    import mlx.core as mx
    import numpy as np

    rng = np.random.default_rng(0)
    worst = 0.0
    for m, k, n in ((24, 40, 56), (300, 520, 260)):
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        got = np.array(mx.matmul(mx.array(a), mx.array(b), stream=mx.cpu), dtype=np.float64)
        want = a.astype(np.float64) @ b.astype(np.float64)
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    return worst


def _check_chosen_kernels(library: str) -> None:
    """In the process that OPENBLAS_CORETYPE was set for: keep the kernels if a matmul agrees with NumPy,
    else re-execute with the library's own choice. Says one line either way."""
    version, theirs = os.environ.pop(_CHOSE).split("|")
    ours = os.environ.get(CORETYPE, "?")
    error = matmul_error()
    if error < 1e-4:
        print(
            f"OpenBLAS {version}: {ours} kernels for this CPU, not the {theirs} kernels it chose (it "
            "predates "
            f"the CPU); a matmul check agrees with NumPy. Set {CORETYPE} to choose yourself.",
            file=sys.stderr,
            flush=True,
        )
        return
    env = dict(os.environ)
    env.pop(CORETYPE, None)
    env[_DONE], env[_REJECTED] = library, f"{version}|{theirs}|{ours}"
    _exec([sys.executable, *sys.orig_argv[1:]], env)


def _exec(argv: list[str], env: dict) -> None:
    """Replace this process with `argv` under `env`, what it printed so far written out first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, env)


def blas_description() -> str:
    """What runs MLX's CPU matmuls here, for reports: "OpenBLAS 0.3.21, Cooperlake kernels", "MKL", ..."""
    kind = loaded_blas()
    if kind == "openblas":
        identity = next(
            (i for i in map(openblas_identity, _openblas_files(_mapped_files() or set())) if i), None
        )
        return f"OpenBLAS {identity[0]}, {identity[1]} kernels" if identity else "OpenBLAS"
    return {"mkl": "MKL", "reference": "the mlx wheel's reference BLAS", "platform": "the platform's BLAS"}[
        kind
    ]
