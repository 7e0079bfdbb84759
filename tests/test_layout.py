"""The package's shape: imports flow one way (no cycles) and modules stay small."""

import ast
import re
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
    files = {_module_name(p): p for package in packages for p in (ROOT / package).rglob("*.py")}
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


def _fields_of(package: str, file: str, name: str | None = None) -> set[str]:
    """The fields of the class `name` in package/file; of every class there when name is None."""
    path = ROOT / package / file
    if not path.is_file():
        return set()
    return {
        node.target.id
        for cls in ast.parse(path.read_text()).body
        if isinstance(cls, ast.ClassDef) and name in (None, cls.name)
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


# (where, name): a name that means something else there than the run's setting of that name, with the reason.
NOT_SETTINGS = {
    ("mlx_grpo.sampling.multiturn.Episode", "reward"): "an episode's score, not the reward functions' names",
    (
        "mlx_grpo.update.logprobs.token_logprobs",
        "temperature",
    ): "1: the model's own log-probs; a run passes its own",
    ("mlx_grpo.update.logprobs.logprobs_after_prompt", "temperature"): "as token_logprobs",
    ("mlx_grpo.update.logprobs.completion_logprobs", "temperature"): "as token_logprobs",
}
EMPTY = ("list", "dict", "set", "tuple")


def _given_elsewhere(default: ast.expr, definers: set[str]) -> bool:
    """Whether a default defines no value of its own: None or an empty container (nothing given), or read from
    the setting's definition (TrainConfig.max_turns, field(default_factory=SamplingSettings), an alias of
    it)."""
    if isinstance(default, ast.Constant) and default.value is None:
        return True
    if isinstance(default, ast.Dict):
        return not default.keys
    if isinstance(default, (ast.List, ast.Tuple, ast.Set)):
        return not default.elts
    if (
        isinstance(default, ast.Call)
        and ast.unparse(default.func) in ("field", "dataclasses.field")
        and any(k.arg == "default_factory" and ast.unparse(k.value) in EMPTY for k in default.keywords)
    ):
        return True
    return any(isinstance(node, ast.Name) and node.id in definers for node in ast.walk(default))


def _setting_copies(package: str = "mlx_grpo", not_settings=NOT_SETTINGS) -> list[str]:
    return [label for _, _, label in _copies_found(package, not_settings)]


def _copies_found(package: str, not_settings: dict) -> list[tuple[str, str, str]]:
    """Second definitions of a setting's default outside its own (a group's field in setting_groups.py, a
    field of config.py's TrainConfig), whose value can drift from the setting's:

    - a dataclass field named as a setting (a group's or TrainConfig's own) with a default of its own;
    - a getattr(x, "setting", default) with a default of its own;
    - a function parameter named as a group's setting with a default of its own (TrainConfig's own names,
      seed, model, output, steps, also name parameters that are not the run's setting: a bootstrap's seed).

    A default of None or an empty container gives nothing; one that reads TrainConfig or a group class (or an
    alias of one: SamplingConfig) takes the setting's own default."""
    groups = ast.parse((ROOT / package / "setting_groups.py").read_text())
    group_classes = {cls.name for cls in groups.body if isinstance(cls, ast.ClassDef)}
    own = _fields_of(package, "config.py", "TrainConfig")
    every = _fields_of(package, "setting_groups.py") | own
    # A group field named as one of TrainConfig's own settings (warm_start's steps, lr) sets that setting for
    # its stage: the name alone is no copy.
    grouped = _fields_of(package, "setting_groups.py") - own
    trees = {path: ast.parse(path.read_text()) for path in sorted((ROOT / package).rglob("*.py"))}
    definers = {"TrainConfig", *group_classes}  # and the names a group class is imported as (SamplingConfig)
    definers |= {
        a.asname
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for a in node.names
        if a.asname and a.name in definers
    }
    found = []
    for path, tree in trees.items():
        if path.name == "setting_groups.py":
            continue

        def copy(where: str, name: str, default) -> bool:
            return (
                default is not None
                and not _given_elsewhere(default, definers)
                and (where, name) not in not_settings
            )

        def visit(node, where: str):
            for child in ast.iter_child_nodes(node):
                here = (
                    f"{where}.{child.name}"
                    if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                    else where
                )
                if (
                    isinstance(child, ast.ClassDef)
                    and here != f"{package}.config.TrainConfig"
                    and any("dataclass" in ast.unparse(d) for d in child.decorator_list)
                ):
                    found.extend(
                        (here, f.target.id, f"{here}.{f.target.id}")
                        for f in child.body
                        if isinstance(f, ast.AnnAssign)
                        and isinstance(f.target, ast.Name)
                        and f.target.id in every
                        and copy(here, f.target.id, f.value)
                    )
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    args = child.args
                    positional = args.posonlyargs + args.args
                    pairs = [
                        *zip(positional[len(positional) - len(args.defaults) :], args.defaults),
                        *zip(args.kwonlyargs, args.kw_defaults),
                    ]
                    found.extend(
                        (here, a.arg, f"{here}({a.arg}={ast.unparse(d)})")
                        for a, d in pairs
                        if a.arg in grouped and copy(here, a.arg, d)
                    )
                if (
                    isinstance(child, ast.Call)
                    and isinstance(child.func, ast.Name)
                    and child.func.id == "getattr"
                    and len(child.args) == 3
                    and isinstance(child.args[1], ast.Constant)
                    and child.args[1].value in every
                    and copy(where, child.args[1].value, child.args[2])
                ):
                    found.append((where, child.args[1].value, f"{where}: {ast.unparse(child)}"))
                visit(child, here)

        visit(tree, _module_name(path))
    return found


def test_the_setting_copy_finder_finds_a_planted_copy(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "setting_groups.py").write_text("@dataclass\nclass S:\n    max_tokens: int = 256\n")
    (package / "config.py").write_text(
        "@dataclass\nclass TrainConfig:\n    max_turns: int = 8\n    seed: int = 0\n"
    )
    (package / "sampler.py").write_text(
        "from .setting_groups import S as Alias\n"
        "@dataclass\nclass C:\n    max_tokens: int = 64\n    top: int = 1\n"
    )
    (package / "given.py").write_text(
        "@dataclass\nclass G:\n    max_tokens: int\n"
    )  # given by its caller: fine
    (package / "carrier.py").write_text(  # a run's settings carried along: copied, and read from TrainConfig
        "from .config import TrainConfig\n"
        "@dataclass\nclass R:\n    max_turns: int = 8\n    seed: int = TrainConfig.seed\n"
        "    max_tokens: int = None\n"
    )
    (package / "functions.py").write_text(
        "from .sampler import Alias\n"
        "def f(prompts, max_tokens=64):\n    return getattr(prompts, 'max_turns', 4)\n"
        "class K:\n    def g(self, *, max_tokens: int = 256, seed=3):\n        pass\n"  # seed: not a group's
        "def h(max_tokens=Alias.max_tokens):\n    return getattr(h, 'other', 1), "
        "getattr(h, 'max_turns', None)\n"
        "def i(a, max_tokens=None, b=[], *, c=lambda max_tokens=(): 0):\n    pass\n"
    )
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert _setting_copies("pkg") == [
        "pkg.carrier.R.max_turns",
        "pkg.functions.f(max_tokens=64)",
        "pkg.functions.f: getattr(prompts, 'max_turns', 4)",
        "pkg.functions.K.g(max_tokens=256)",
        "pkg.sampler.C.max_tokens",
    ]


def test_each_setting_has_its_default_in_one_place():
    assert _setting_copies() == []


def test_each_name_said_not_to_be_a_setting_would_be_taken_for_one():
    """NOT_SETTINGS lists only what the finder would report without it: an entry whose code went away goes
    too."""
    unlisted = {(where, name) for where, name, _ in _copies_found("mlx_grpo", {})}
    assert set(NOT_SETTINGS) <= unlisted, set(NOT_SETTINGS) - unlisted


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
