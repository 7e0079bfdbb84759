"""Write docs/settings.md and docs/commands.md from the code: TrainConfig's fields (mlx_grpo/config.py)
and the other commands' options.

Every train setting is a field of the TrainConfig dataclass, with its default
and its help text (the field's metadata, config.field_help), grouped under the
comment lines of the class; a group of settings (config.GROUPS: `sampling`,
`objective`, `task_options`, `health`, `warm_start`) is its own dataclass
(setting_groups.py), whose fields are listed where the group is, under their
flat names (temperature, health_window). Which commands read each setting is
setting_groups.COMMAND_READS (config.READS). The other commands' options are
typer's. This script renders both, one page each, so the reference cannot drift
from the code:

    python scripts/settings_doc.py          # rewrite docs/settings.md and docs/commands.md
    python scripts/settings_doc.py --check  # exit 1 if either is stale (tests/test_docs.py checks the same)
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlx_grpo.config import FIELDS, GROUPS, READS, TrainConfig, field_help, readers  # noqa: E402

OUT = ROOT / "docs" / "settings.md"
COMMANDS_OUT = ROOT / "docs" / "commands.md"
_FIELD = re.compile(r"^    (\w+): ")  # a field's first line (a long help text continues on the next)
_SECTION = re.compile(r"^    # (.+)$")


def _default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        value = field.default
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(name: str, helps: dict[str, str]) -> str:
    return (
        f"| `{name}` | {_cell(_default(FIELDS[name]))} | {_cell(helps[name])} | {', '.join(readers(name))} |"
    )


def train_settings() -> list[str]:
    """One table per section of TrainConfig, in the order of the class; a group's settings where the
    group is."""
    helps, lines = field_help(), []
    for line in inspect.getsource(TrainConfig).splitlines():
        section, field = _SECTION.match(line), _FIELD.match(line)
        if section:
            if lines:
                lines.append("")
            lines += [
                f"**{section.group(1)}**",
                "",
                "| key | default | meaning | read by |",
                "| --- | --- | --- | --- |",
            ]
        elif field and field.group(1) in GROUPS:  # a group's settings, by their flat names
            kind, prefix = GROUPS[field.group(1)]
            lines += [_row(prefix + f.name, helps) for f in dataclasses.fields(kind)]
        elif field and field.group(1) in FIELDS:
            lines.append(_row(field.group(1), helps))
    return lines


def _names(names) -> str:
    return ", ".join(f"`{name}`" for name in FIELDS if name in names)


# What each command that reads settings does with them, under its options (train's page is settings.md).
_READING = {
    "sft": "sft's settings are the flags above. A setting it does not read, typed as a flag, "
    "is refused, naming the commands that read it (`sft does not read group_size (train reads it)`); "
    "in a `--config` file "
    "(a train recipe serves sft too: `sft --config configs/ocaml.yaml`) it is left out, and sft names "
    "the ones it leaves out.",
    "eval": "From a run's `config.yaml` or a `--config` file, {command} reads {names}; "
    "the file's other settings are left out (a training recipe serves {command} too). "
    "A setting typed as a flag that {command} "
    "does not read is refused, naming the commands that read it.",
}
_READING["compare"] = _READING["eval"]


def command_options() -> list[str]:
    """Each other command's options, from the CLI itself."""
    import typer

    from mlx_grpo.cli import app

    group = typer.main.get_command(app)
    lines = []
    for name in sorted(group.commands):
        if name == "train":
            continue
        command = group.commands[name]
        options = [p for p in command.params if p.param_type_name == "option" and p.name != "help"]
        if not options:
            continue
        lines += ["", f"**mlx-grpo {name}**", "", "| flag | default | meaning |", "| --- | --- | --- |"]
        for p in options:
            flag = " / ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
            default = "" if p.default is None or p.is_flag and p.default is False else f"`{p.default}`"
            lines.append(f"| {flag} | {_cell(default)} | {_cell(' '.join((p.help or '').split()))} |")
        if name in _READING:
            lines += ["", _READING[name].format(command=name, names=_names(READS[name]))]
    return lines


def render() -> str:
    head = [
        "# Settings",
        "",
        "Generated from `mlx_grpo/config.py` and the CLI by `python scripts/settings_doc.py`; do not edit by "
        "hand.",
        "",
        "Every train setting is a config key and a flag (`lr` is `--lr`, `group_size` is `--group-size`). "
        "`mlx-grpo train --help` prints the same list. `train` reads every setting; the other commands "
        "read those their column names (`sft` as flags, `eval` and `compare` from a config file): "
        "[commands.md](commands.md).",
        "",
        "In a YAML file the settings of a group (" + ", ".join(f"`{g}`" for g in GROUPS) + ") may also be "
        "given as a mapping of their names within the group: `health: {window: 4}` is `health_window: 4`, "
        "`sampling: {temperature: 0.7}` is `temperature: 0.7` (not both ways in one file).",
        "",
    ]
    tail = [
        "",
        "The other commands' options (`eval`, `compare`, `sft`, `inspect`, ...) "
        "are in [commands.md](commands.md).",
    ]
    return "\n".join(head + train_settings() + tail) + "\n"


def render_commands() -> str:
    head = [
        "# Options of the other commands",
        "",
        "Generated from the CLI by `python scripts/settings_doc.py`; do not edit by hand. `--help` after a "
        "command prints the same. `train`'s settings are in [settings.md](settings.md), with the commands "
        "that read each. A setting typed as a flag to a command that does not read it is refused in one "
        "line naming the commands that do.",
    ]
    return "\n".join(head + command_options()) + "\n"


def pages() -> dict[Path, str]:
    return {OUT: render(), COMMANDS_OUT: render_commands()}


if __name__ == "__main__":
    stale = False
    for path, text in pages().items():
        if "--check" in sys.argv:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                print(f"{path.relative_to(ROOT)} is stale: run python scripts/settings_doc.py")
                stale = True
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    sys.exit(1 if stale else 0)
