"""Each setting is defined once: its default lives in its group (setting_groups.py) or TrainConfig, and
no dataclass field, getattr default or parameter default elsewhere copies it."""

import ast

from layout_files import ROOT, module_name


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

        visit(tree, module_name(path, ROOT))
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
