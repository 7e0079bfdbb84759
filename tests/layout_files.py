"""The repository's root and a file's module name, shared by the layout test files."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module in `path`, a file under `root` (an __init__ names its package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
