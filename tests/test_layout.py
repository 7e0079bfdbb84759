"""The package's shape: imports flow one way (no cycles) and modules stay small."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at any depth of the file (late imports count)."""
    files = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in files else base)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_relative_and_late_imports():
    graph = _import_graph("mlx_grpo")
    assert "mlx_grpo.run.checkpoint" in graph["mlx_grpo.run.trainer"]       # from . import checkpoint
    assert "mlx_grpo.run.reporting" in graph["mlx_grpo.config"]             # imported inside a function
    assert "mlx_grpo.models.loading" in graph["mlx_grpo.run.trainer"]       # from ..models.loading import


def test_mlx_grpo_has_no_import_cycle():
    assert _find_cycle(_import_graph("mlx_grpo")) is None


def test_rewards_has_no_import_cycle():
    assert _find_cycle(_import_graph("rewards")) is None



MAX_LINES = 450  # a module past this does several jobs: split it by concern


def test_no_module_passes_the_size_limit():
    too_long = {str(p.relative_to(ROOT)): n for package in ("mlx_grpo", "rewards") for p in (ROOT / package).rglob("*.py")
                if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not too_long, f"split these modules by concern (over {MAX_LINES} lines): {too_long}"
