"""examples/quickstart.ipynb runs top to bottom on the embedded model (nbclient)."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the test extra installs nbformat")
nbclient = pytest.importorskip("nbclient", reason="the test extra installs nbclient")
pytest.importorskip("ipykernel", reason="the test extra installs ipykernel")

NOTEBOOK = Path(__file__).parent.parent / "examples" / "quickstart.ipynb"


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def test_quickstart_notebook_runs_top_to_bottom(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")  # stored without outputs
    # Raises CellExecutionError, with the cell and its traceback, if any cell fails.
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    texts = [_text(c) for c in code]
    assert "correctness_reward" in texts[2]  # the group's scores, part by part
    assert "grad_norm" in texts[3]  # the one-step update's metrics
    assert "reward/mean" in texts[4]  # the few steps' metrics table
    assert "accuracy" in texts[6]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert any("image/png" in out.get("data", {}) for out in code[5].outputs)  # the plot, inline
