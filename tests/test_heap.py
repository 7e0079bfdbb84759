"""heap.keep_freed_memory: a large block freed and allocated again is not faulted in again (glibc only)."""

import os
import subprocess
import sys

import pytest

SIZE = 96 << 20  # a block above glibc's largest mmap threshold (32 MB): mapped fresh unless told otherwise
PAGES = SIZE // 4096

CHILD = r"""
import ctypes, resource, sys
from mlx_grpo.models.heap import keep_freed_memory
if sys.argv[1] == "kept":
    assert keep_freed_memory()
if sys.argv[1] == "api":  # the Python API loads a model and leaves the allocator as it was
    import mlx_grpo
    mlx_grpo.load_policy()
if sys.argv[1] == "api-asked":
    import mlx_grpo
    mlx_grpo.load_policy()
    assert mlx_grpo.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = int(sys.argv[2])

def touch_and_free():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)

touch_and_free()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    touch_and_free()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, env: dict | None = None) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(SIZE)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_large_freed_block_is_reused_without_faulting_its_pages_again():
    assert _faults("glibc") > 2 * PAGES  # as glibc comes: each 96 MB block is mapped and faulted in anew
    assert _faults("kept") < PAGES // 10  # kept in the heap: the same pages come back


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_users_own_malloc_setting_wins():
    # MALLOC_MMAP_MAX_ left as the user set it (65536 = glibc's default: map large blocks)
    assert _faults("kept", {"MALLOC_MMAP_MAX_": "65536"}) > 2 * PAGES


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_python_api_changes_the_allocator_only_when_asked():
    assert _faults("api") > 2 * PAGES  # load_policy alone: glibc as it comes
    assert _faults("api-asked") < PAGES // 10  # the one documented call
