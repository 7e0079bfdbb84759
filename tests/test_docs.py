"""The README and docs/ show commands that exist: every `mlx-grpo` subcommand and flag they
name is one the CLI has, every script and config file they point to is there, and every
config file builds."""

import re
import shlex
from pathlib import Path

import pytest
import typer

from mlx_grpo.cli import app
from mlx_grpo.config import build_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def _command_lines(text: str) -> list[str]:
    """`mlx-grpo ...` lines of fenced shell blocks (backslash continuations joined) and of inline code."""
    lines, fence, block = [], None, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```") and fence is None:
            fence, block = stripped[3:].strip(), []
        elif stripped.startswith("```"):
            if fence in ("bash", "sh", "shell", "console", ""):
                lines += _shell_commands("\n".join(block))
            fence = None
        elif fence is not None:
            block.append(line)
    lines += [m.strip() for m in re.findall(r"`(mlx-grpo [^`]+)`", text)]
    return lines


def _shell_commands(block: str) -> list[str]:
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|;|\|", line.split(" #")[0]):
            if part.strip().startswith(("mlx-grpo ", "python scripts/", "python -m mlx_grpo")):
                commands.append(part.strip())
    return commands


def _cli_options() -> dict[str, set[str]]:
    group = typer.main.get_command(app)
    return {
        name: {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        for name, command in group.commands.items()
    }


def _documented_commands():
    return [(doc.name, line) for doc in DOCS for line in _command_lines(doc.read_text())]


def test_the_readme_is_a_front_door():
    """At most 250 lines: what this is, the two set-up commands, then links into docs/ (each one there)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert (
        "pip install . && mlx-grpo train" in text and 'pip install ".[test]" && python -m pytest -q' in text
    )
    links = re.findall(r"\]\(((?:docs/)?[\w-]+\.md)\)", text)
    assert len(links) >= 10 and all((ROOT / link).is_file() for link in links)


def test_the_docs_show_commands():
    """The extraction itself finds the README's main commands (so the checks below check something)."""
    lines = [line for _, line in _documented_commands()]
    assert "mlx-grpo train" in lines
    assert any(line.startswith("mlx-grpo compare --trained") for line in lines)
    assert len(lines) > 20


@pytest.mark.parametrize("doc,line", _documented_commands())
def test_documented_command_exists(doc, line):
    options = _cli_options()
    words = shlex.split(line.replace("...", ""), comments=True)
    if words[0] == "python" and words[1].startswith("scripts/"):
        script = ROOT / words[1]
        assert script.is_file(), f"{doc}: {line}: no {words[1]}"
        source = script.read_text()
        for flag in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
            assert f'"{flag}"' in source, f"{doc}: {line}: {words[1]} has no {flag}"
        return
    words = words[3:] if words[:3] == ["python", "-m", "mlx_grpo"] else words[1:]
    command = words[0]
    assert command in options, f"{doc}: `{line}`: mlx-grpo has no command {command!r}"
    for word in words[1:]:
        flag = word.split("=")[0]
        if flag.startswith("--") and flag != "--help":
            assert flag in options[command], f"{doc}: `{line}`: `mlx-grpo {command}` has no option {flag}"
        if re.fullmatch(r"configs/[\w.-]+\.ya?ml", word):
            assert (ROOT / word).is_file(), f"{doc}: `{line}`: no {word}"


@pytest.mark.parametrize("config_file", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_file_builds(config_file):
    config = build_config({}, str(config_file))
    assert config.task and config.steps > 0


def _documented_paths():
    pattern = (
        r"\b((?:mlx_grpo|rewards|scripts|tests|configs|examples|docs)/[\w/.-]*\w\.(?:py|yaml|ipynb|md|sh))\b"
    )
    return sorted({(doc.name, path) for doc in DOCS for path in re.findall(pattern, doc.read_text())})


def test_the_docs_name_files():
    assert ("algorithms.md", "mlx_grpo/update/losses.py") in _documented_paths()


@pytest.mark.parametrize("doc,path", _documented_paths())
def test_documented_file_exists(doc, path):
    assert (ROOT / path).exists(), f"{doc} names {path}, which does not exist"


def test_the_settings_reference_is_generated_from_the_code():
    """docs/settings.md and docs/commands.md are scripts/settings_doc.py's rendering of TrainConfig and the
    CLI, so they cannot drift."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("settings_doc", ROOT / "scripts" / "settings_doc.py")
    settings_doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(settings_doc)
    text, commands = settings_doc.render(), settings_doc.render_commands()
    from mlx_grpo.config import FIELDS

    assert all(f"| `{name}` |" in text for name in FIELDS)  # every flat setting, a group's included
    assert "**mlx-grpo export**" in commands and "`--outtype`" in commands
    for name, expected in (("settings.md", text), ("commands.md", commands)):
        assert (ROOT / "docs" / name).read_text(encoding="utf-8") == expected, (
            f"docs/{name} is stale: run python scripts/settings_doc.py"
        )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_lead_somewhere(doc):
    """The README's sections moved into docs/: every relative link of every page still resolves."""
    for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
        if not link.startswith(("http://", "https://", "mailto:")):
            assert (doc.parent / link).exists(), f"{doc.name} links to {link}, which does not exist"
