"""scripts/profile_cores.py: each thread's CPU time read from /proc, phases summed over their calls, and perf
samples classed by what they were doing (hand-picked symbols of each kind)."""

import importlib.util
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # the script imports benchlib beside it
spec = importlib.util.spec_from_file_location("profile_cores", ROOT / "scripts" / "profile_cores.py")
profile_cores = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_cores)


@pytest.mark.parametrize(
    "dso, symbol, doing",
    [
        ("libopenblasp-r0.3.21.so", "sgemm_kernel_COOPERLAKE", "matmul arithmetic"),
        ("libopenblasp-r0.3.21.so", "sgemm_incopy_COOPERLAKE", "matmul packing"),
        ("libopenblasp-r0.3.21.so", "blas_thread_server", "waiting (yield, sleep)"),
        ("[kernel.kallsyms]", "do_sched_yield", "waiting (yield, sleep)"),
        ("[kernel.kallsyms]", "clear_page_erms", "kernel: page faults, copies"),
        ("libmlx.so", "mlx::core::simd::exp<float, 1>", "MLX's other ops"),
        ("/root/.cache/mlx/libCf4IBroadcastBDf4ISubtractACEf4OExpD_VV_f4f4.so", "exp", "MLX's other ops"),
        ("libpython3.11.so.1.0", "insertdict", "Python, malloc and the rest"),
    ],
)
def test_a_sample_is_classed_by_its_library_and_symbol(dso, symbol, doing):
    assert profile_cores.classify(dso, symbol) == doing


def test_a_phase_counts_the_cpu_time_of_this_thread_in_it():
    phases = profile_cores.Phases()

    def spin(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    busy = phases.wrap("busy", spin)
    busy(0.2)
    busy(0.1)
    (row,) = phases.rows()
    assert row["phase"] == "busy" and row["wall_s"] >= 0.3 and 0.2 <= row["cpu_s"] <= row["wall_s"] + 0.05
    assert row["threads"][0]["main"] and len(phases.spans) == 2
