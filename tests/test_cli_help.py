"""Every command's ``--help``: flags without a ``<bool>`` placeholder, help text the terminal wraps (no line
break from a docstring inside a sentence, brackets printed literally), one ``--cache-dir`` default."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from medadapt.cache import default_cache_dir
from medadapt.cli import app
from medadapt.cli._help import one_paragraph_per_block

CLI = Path(__file__).resolve().parents[1] / "medadapt" / "cli"


def _commands(command=None, path=()):
    """``(path, click command)`` for the root and every command and group below it."""
    command = command or typer.main.get_command(app)
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = [path for path, _ in _commands()]


def _help(path, columns: int = 200) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "medadapt")
def test_flags_show_no_type_placeholder(path):
    text = _help(path)
    assert "<bool>" not in text
    flags = [p for p in dict(_commands())[path].params if getattr(p, "is_flag", False)]
    for flag in flags:  # each flag still listed, with its --no- form when it has one
        row = next(line for line in text.splitlines() if f" {flag.opts[0]} " in line)
        assert all(opt in row for opt in flag.secondary_opts), row
    assert re.search(r"--help\s{2,}Show this message", text), text


def test_boolean_flags_render_as_plain_switches():
    mine = _help(("data", "sts-triplets"))
    row = next(line for line in mine.splitlines() if "--symmetric" in line)
    assert re.search(r"--symmetric\s+--no-symmetric\s+Let every synonym", row), row
    row = next(line for line in _help(("eval",)).splitlines() if "--no-cache" in line)
    assert re.search(r"--no-cache\s+Encode without", row), row


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "medadapt")
def test_help_is_logical_paragraphs_wrapped_by_the_terminal(path):
    command = dict(_commands())[path]
    first = one_paragraph_per_block(command.help).split("\n\n")[0].replace("\\[", "[")
    for columns in (80, 200):
        text = _help(path, columns)
        lines = [ln.strip() for ln in text.splitlines()]
        words = " ".join(" ".join(lines).split())
        assert first in words, (columns, first)  # nothing lost, no markup eaten
        if columns == 200 and len(first) < 190:
            assert first in lines, first  # one line when the terminal is wide enough
    for param in command.params:
        assert "\n" not in (param.help or ""), (param.name, param.help)


def test_the_root_help_lists_each_command_on_full_width_lines():
    text = _help((), 200)
    row = next(line for line in text.splitlines() if "│ eval " in line)
    assert "QA (Recall@5/20, nDCG@20)" in row, row  # the docstring used to break after "QA"


def test_help_text_with_brackets_is_printed_literally():
    assert "openai:MODEL[@BASE_URL] or package.module:object" in _help(("data", "label"))
    assert "JSON {term: [synonyms]} or TSV" in _help(("data", "sts-triplets"))
    assert "medadapt[onnx], medadapt[openvino]" in _help(("eval",))


def test_one_cache_default_in_every_command(monkeypatch):
    monkeypatch.delenv("MEDADAPT_CACHE", raising=False)
    real = str(default_cache_dir()).replace(str(Path.home()), "~", 1)
    helps = {path: p.help for path, command in _commands() for p in command.params if p.name == "cache_dir"}
    assert {("eval",), ("train",), ("index",), ("encode",), ("report",), ("data", "mine")} <= set(helps)
    assert len(set(helps.values())) == 1, helps
    assert "$MEDADAPT_CACHE" in next(iter(helps.values())) and real in next(iter(helps.values()))
    for path in helps:
        assert real in _help(path), path


def test_command_functions_are_short():
    """The CLI is a thin shell: no command function (``*_cmd``) over 60 lines."""
    long = []
    for path in CLI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_cmd"):
                size = node.end_lineno - node.lineno + 1
                if size > 60:
                    long.append(f"{path.name}:{node.name} ({size} lines)")
    assert not long, long
