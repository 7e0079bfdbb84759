"""Write docs/settings.md and docs/commands.md from the code: TrainConfig's fields (mlx_grpo/config.py) and the
other commands' options.

Every train setting is a field of the TrainConfig dataclass, with its default
and a trailing comment that says what it does, grouped under the comment
lines of the class; a group of settings (config.GROUPS: `sampling`, `objective`,
`task_options`, `health`) is its own dataclass (setting_groups.py), whose fields
are listed where the group is, under their flat names (temperature, health_window). The other commands' options are typer's. This script
renders both, one page each, so the reference cannot drift from the code:

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

from mlx_grpo.config import GROUPS, TrainConfig  # noqa: E402

OUT = ROOT / "docs" / "settings.md"
COMMANDS_OUT = ROOT / "docs" / "commands.md"
_FIELD = re.compile(r"^    (\w+): [^=]+?=.*?(?:  # (.*))?$")
_SECTION = re.compile(r"^    # (.+)$")


def _default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        value = field.default
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def train_settings() -> list[str]:
    """One table per section of TrainConfig, in the order of the class."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    lines = []
    for line in inspect.getsource(TrainConfig).splitlines():
        section, field = _SECTION.match(line), _FIELD.match(line)
        if section and not field:
            if lines:
                lines.append("")
            lines += [f"**{section.group(1)}**", "", "| key | default | meaning |", "| --- | --- | --- |"]
        elif field and field.group(1) in GROUPS:  # a group's settings, by their flat names
            kind, prefix = GROUPS[field.group(1)]
            rows = dict(_FIELD.match(row).groups() for row in inspect.getsource(kind).splitlines() if _FIELD.match(row))
            lines += [f"| `{prefix}{f.name}` | {_cell(_default(f))} | {_cell(rows.get(f.name) or '')} |"
                      for f in dataclasses.fields(kind)]
        elif field and field.group(1) in fields:
            name = field.group(1)
            lines.append(f"| `{name}` | {_cell(_default(fields[name]))} | {_cell(field.group(2) or '')} |")
    return lines


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
    return lines


def render() -> str:
    head = ["# Settings", "",
            "Generated from `mlx_grpo/config.py` and the CLI by `python scripts/settings_doc.py`; do not edit by "
            "hand.", "",
            "Every train setting is a config key and a flag (`lr` is `--lr`, `group_size` is `--group-size`). "
            "`mlx-grpo train --help` prints the same list.", "",
            "In a YAML file the settings of a group (" + ", ".join(f"`{g}`" for g in GROUPS) + ") may also be "
            "given as a mapping of their names within the group: `health: {window: 4}` is `health_window: 4`, "
            "`sampling: {temperature: 0.7}` is `temperature: 0.7` (not both ways in one file).", ""]
    tail = ["", "The other commands' options (`eval`, `compare`, `sft`, `inspect`, ...) are in [commands.md](commands.md)."]
    return "\n".join(head + train_settings() + tail) + "\n"


def render_commands() -> str:
    head = ["# Options of the other commands", "",
            "Generated from the CLI by `python scripts/settings_doc.py`; do not edit by hand. `--help` after a "
            "command prints the same. `train`'s settings are in [settings.md](settings.md); `sft` takes them too."]
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
