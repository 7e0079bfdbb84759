"""The package's shape: imports flow one way (no cycles) and modules stay small. A setting's
default defined once is tests/test_layout_settings.py's."""

import ast
import re
from pathlib import Path

from layout_files import ROOT, module_name


def _import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at any depth of the file (late imports count)."""
    files = {module_name(p, ROOT): p for p in (ROOT / package).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(
                        here[: len(here) - node.level + 1] + ([node.module] if node.module else [])
                    )
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
                return path[path.index(nxt) :] + [nxt]
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
    assert "mlx_grpo.run.checkpoint" in graph["mlx_grpo.run.trainer"]  # from . import checkpoint
    assert "mlx_grpo.errors" in graph["mlx_grpo.models.quantized"]  # imported inside a function
    assert "mlx_grpo.models.loading" in graph["mlx_grpo.run.setup"]  # from ..models.loading import


def test_mlx_grpo_has_no_import_cycle():
    assert _find_cycle(_import_graph("mlx_grpo")) is None


# The floors, bottom first: a module imports only from its own floor or lower ones. Written
# down here once; docs/api.md and CONTRIBUTING.md describe the same order.
FLOORS = [
    (
        "mlx_grpo.errors",
        "mlx_grpo.files",
        "mlx_grpo.stats",
        "mlx_grpo.device",
        "mlx_grpo.blas",
        "mlx_grpo.version",
    ),  # only each other
    ("mlx_grpo.update", "mlx_grpo.models"),
    ("mlx_grpo.config", "mlx_grpo.config_checks", "mlx_grpo.setting_groups"),
    ("mlx_grpo.tasks",),
    ("mlx_grpo.tools",),  # tool-calling episodes, scored by tasks/' rewards
    ("mlx_grpo.sampling",),
    ("mlx_grpo.run",),
    ("mlx_grpo.evaluation",),
    ("mlx_grpo.api", "mlx_grpo.cli", "mlx_grpo.__main__", "mlx_grpo"),
]
# Imports that may look up a floor, each with the reason it must. Starts empty: keep it so.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def floor_of(module: str) -> int:
    """The floor of the longest FLOORS name that is the module or a package holding it."""
    found = [
        (len(name), i)
        for i, names in enumerate(FLOORS)
        for name in names
        if module == name or module.startswith(name + ".")
    ]
    assert found, f"{module} is on no floor: add it to FLOORS"
    return max(found)[1]


def test_the_floor_rule_catches_an_upward_import():
    assert floor_of("mlx_grpo.models.gguf") < floor_of("mlx_grpo.config") < floor_of("mlx_grpo.run.trainer")
    assert floor_of("mlx_grpo.stats") == 0 and floor_of("mlx_grpo") == len(FLOORS) - 1
    planted = {"mlx_grpo.models.adapters": {"mlx_grpo.run.checkpoint"}}
    assert _upward(planted) == [
        "mlx_grpo.models.adapters (floor 1) imports mlx_grpo.run.checkpoint (floor 6)"
    ]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{m} (floor {floor_of(m)}) imports {t} (floor {floor_of(t)})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if floor_of(t) > floor_of(m) and (m, t) not in ALLOWED_UPWARD
    ]


def test_every_import_looks_down():
    assert _upward(_import_graph("mlx_grpo")) == []


def test_tasks_never_reach_up_into_the_domains_or_the_judge():
    """tasks/ gathers what the engine needs from a task module by name (tasks/contract.py); it imports nothing
    from `rewards` (the domains, the judge), which sit above it and import it."""
    reached = sorted(
        f"{path.relative_to(ROOT)} imports {node.module or ''}"
        for path in (ROOT / "mlx_grpo" / "tasks").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        and not node.level
        and (node.module or "").startswith("rewards")
        or isinstance(node, ast.Import)
        and any(a.name.startswith("rewards") for a in node.names)
    )
    assert reached == []


def test_rewards_has_no_import_cycle():
    assert _find_cycle(_import_graph("rewards")) is None


def _script_graph(folder: Path | None = None) -> dict[str, set[str]]:
    """Script -> the scripts it imports. A script runs with scripts/ on the path, so it imports another by its
    bare name (`import bench`, `from decode_loops import bare_loop`), at any depth of the file."""
    folder = folder or ROOT / "scripts"
    files = {p.stem: p for p in folder.glob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                targets.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                targets.update(a.name.split(".")[0] for a in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def test_the_script_graph_sees_late_and_aliased_imports(tmp_path):
    graph = _script_graph()
    assert "bench_blas" in graph["bench"]  # from bench_blas import gflops
    assert "build_tiny_model" in graph["build_tiny_web_model"]  # import build_tiny_model as base
    (tmp_path / "a.py").write_text("def f():\n    from b import g\n")
    (tmp_path / "b.py").write_text("import a as the_a\n")
    assert _find_cycle(_script_graph(tmp_path)) == ["a", "b", "a"]


def test_scripts_have_no_import_cycle():
    """A script another imports is a library to it: the two must not need each other to load."""
    assert _find_cycle(_script_graph()) is None


MAX_LINES = 450  # a module past this does several jobs: split it by concern
SIZED_FOLDERS = ("mlx_grpo", "rewards", "scripts", "tests")  # a script or a test file is no exception


def _long_modules(root: Path, folders=SIZED_FOLDERS) -> dict[str, int]:
    return {
        p.relative_to(root).as_posix(): n
        for folder in folders
        for p in sorted((root / folder).rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }


def test_the_size_check_finds_a_long_script_and_test(tmp_path):
    for folder in ("scripts", "tests/deep"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "scripts" / "short.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "scripts" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "tests" / "deep" / "test_long.py").write_text("x = 1\n" * (MAX_LINES + 2))
    assert _long_modules(tmp_path) == {
        "scripts/long.py": MAX_LINES + 1,
        "tests/deep/test_long.py": MAX_LINES + 2,
    }


def test_no_module_passes_the_size_limit():
    too_long = _long_modules(ROOT)
    assert not too_long, f"split these modules by concern (over {MAX_LINES} lines): {too_long}"


# A name with one leading underscore is private to its package: the folder that holds its
# module. A module may import it (or read it as `module._name`) from a module in its own folder,
# never from another folder: mlx_grpo/sampling/ does not reach into mlx_grpo/update/, nor
# mlx_grpo/run/ into mlx_grpo/files.py, nor rewards/ into mlx_grpo/. What is shared is public.
# tests/ and scripts/ are outside the rule: tests pin down internals and benchmarks time them.
def _package_of(module: str, files: dict[str, Path]) -> str:
    path = files.get(module)
    return module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]


def _private_crossings(packages=("mlx_grpo", "rewards")) -> list[str]:
    files = {module_name(p, ROOT): p for package in packages for p in (ROOT / package).rglob("*.py")}
    found = []
    for name, path in sorted(files.items()):
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        home = _package_of(name, files)
        tree = ast.parse(path.read_text())
        modules = {}  # local name -> a module of ours it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = (
                    ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                    if node.level
                    else node.module or ""
                )
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in files:
                        modules[alias.asname or alias.name] = full
                    elif base in files and _private(alias.name) and _package_of(base, files) != home:
                        found.append(f"{name} imports {alias.name} from {base}")
            elif isinstance(node, ast.Import):
                modules.update({a.asname: a.name for a in node.names if a.asname and a.name in files})
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and _private(node.attr)
                and (target := modules.get(node.value.id))
                and _package_of(target, files) != home
            ):
                found.append(f"{name} reads {target}.{node.attr}")
    return sorted(set(found))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_privacy_rule_catches_a_crossing(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    for folder in ("low", "high"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("def _helper(): pass\n")
    (package / "low" / "b.py").write_text("from .a import _helper\n")  # its own folder: fine
    (package / "high" / "c.py").write_text(
        "from ..low.a import _helper\nfrom ..low import a as _a\n_a._helper()\n"
    )
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _private_crossings(("pkg",)) == [
        "pkg.high.c imports _helper from pkg.low.a",
        "pkg.high.c reads pkg.low.a._helper",
    ]


def test_no_private_name_crosses_a_package():
    assert _private_crossings() == []


# Code, configs and data comments say what is done and why, in the present tense: never when or in which
# issue or session it was found. These are the mechanical signs of a history; evidence is cited by where it
# is kept (docs/, a paper, another project's issue such as "mlx-lm-lora #55").
HISTORY_WORDS = re.compile(r"\bissues? #?\d+|\bsessions?\b|\b20\d\d-\d\d-\d\d\b|\brecipe v\d", re.IGNORECASE)
HISTORY_FOLDERS = ("mlx_grpo", "rewards", "configs")
PROSE_SUFFIXES = (".py", ".yaml", ".yml", ".txt", ".md")
# (file, phrase): a line holding the phrase uses the word in another sense. POSIX: a process group in a
# session.
NOT_HISTORY = {("rewards/sandbox/__init__.py", "its own session and process group")}


def _history_words(folders=HISTORY_FOLDERS) -> list[str]:
    found = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in PROSE_SUFFIXES or "__pycache__" in path.parts:
                continue
            name = path.relative_to(ROOT).as_posix()
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if any(name == f and phrase in line for f, phrase in NOT_HISTORY):
                    continue
                found += [f"{name}:{number}: {m.group(0)!r}" for m in HISTORY_WORDS.finditer(line)]
    return found


def test_the_history_finder_finds_planted_history(tmp_path, monkeypatch):
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "a.py").write_text(
        "x = 1  # issue 27: the model wrote '#### 3'\n"
        "y = 2  # added in the fifteenth session, 2026-11-28\n"
        "z = 3  # a run of a run keeps its first run's base; issue a warning\n"
    )
    (folder / "b.yaml").write_text("lr: 1e-5  # Recipe v3 again\n")
    (folder / "c.json").write_text('{"note": "issue 5"}')  # data, not prose
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _history_words(("pkg",)) == [
        "pkg/a.py:1: 'issue 27'",
        "pkg/a.py:2: 'session'",
        "pkg/a.py:2: '2026-11-28'",
        "pkg/b.yaml:1: 'Recipe v3'",
    ]


def test_code_and_configs_tell_no_history():
    found = _history_words()
    assert not found, "say what and why, not when it was found (CONTRIBUTING.md, How we write): " + "; ".join(
        found
    )


MAX_DOC_LINES = 300  # a page past this is several pages, or evidence that belongs in docs/results/


def _long_pages(folder: Path) -> dict[str, int]:
    return {
        path.relative_to(folder.parent).as_posix(): n
        for path in sorted(folder.rglob("*.md"))
        if (n := len(path.read_text().splitlines())) > MAX_DOC_LINES
    }


def test_the_page_length_check_finds_a_long_page(tmp_path):
    (tmp_path / "docs" / "deep").mkdir(parents=True)
    (tmp_path / "docs" / "short.md").write_text("line\n" * MAX_DOC_LINES)
    (tmp_path / "docs" / "deep" / "long.md").write_text("line\n" * (MAX_DOC_LINES + 1))
    assert _long_pages(tmp_path / "docs") == {"docs/deep/long.md": MAX_DOC_LINES + 1}


def test_no_docs_page_passes_the_length_limit():
    too_long = _long_pages(ROOT / "docs")
    assert not too_long, (
        f"cut these pages to {MAX_DOC_LINES} lines (evidence goes to docs/results/): {too_long}"
    )
