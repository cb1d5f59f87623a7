"""Every command's ``--help``: flags without a ``<bool>`` placeholder, help text the terminal wraps (no line
break from a docstring inside a sentence, brackets printed literally), one ``--cache-dir`` default."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from rich.markup import escape
from typer.testing import CliRunner

import medadapt
import medadapt.cli as medadapt_cli
import medadapt.cli.data as cli_data
from medadapt.cache import default_cache_dir
from medadapt.cli import app
from medadapt.cli._help import App, Lazy, one_paragraph_per_block

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
    """The CLI is a thin shell: no command function (``*_cmd``) or command body (``run_*``) over 60 lines."""
    long = []
    for path in CLI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and (node.name.endswith("_cmd") or node.name.startswith("run_")):
                size = node.end_lineno - node.lineno + 1
                if size > 60:
                    long.append(f"{path.name}:{node.name} ({size} lines)")
    assert not long, long


# ------------------------------------------------------------------ lazy commands: fast root help, no drift
_PROBE = """
import sys
from typer.testing import CliRunner

watched = set({watched!r})

def loaded():
    return sorted(watched & set(sys.modules))

import medadapt, medadapt.errors, medadapt.progress
from medadapt.cli import app
import medadapt.cli._console, medadapt.cli._help
assert not loaded(), ("import", loaded())
for args, code in ((["--help"], 0), (["version"], 0), (["--version"], 0), (["data", "--help"], 0), (["evl"], 2)):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == code, (args, result.output)
    assert not loaded(), (args, loaded())
heavy = set({heavy!r})
for path in {paths!r}:  # each command's own help: its options module, never its body
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output, (path, result.output)
    assert not heavy & set(sys.modules), (path, sorted(heavy & set(sys.modules)))
print("ok")
"""
#: what a command's ``--help`` must not import (the body of a command imports them when it runs)
HEAVY = ["torch", "sentence_transformers", "transformers", "faiss"]


def test_help_imports_no_command_body():
    """``medadapt --help``, ``version``, ``--version``, ``data --help`` answer without torch, sentence-transformers
    or any command's module (they took 8-12 s when the CLI imported every command); every command's own help
    (``eval --help``, ``index upgrade-queries --help`` ...) imports its options module alone, without torch,
    sentence-transformers or faiss."""
    tables = (*medadapt_cli.COMMANDS.values(), *medadapt_cli.DATA_COMMANDS.values())
    watched = {"torch", "sentence_transformers", "transformers", "medadapt.cli._common"} | {e.module for e in tables}
    paths = [list(path) for path in COMMANDS if path]
    assert ["index", "upgrade-queries"] in paths and ["eval"] in paths and ["data", "mine"] in paths
    probe = _PROBE.format(watched=sorted(watched), heavy=HEAVY, paths=paths)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    result = subprocess.run([sys.executable, "-m", "medadapt", "--version"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == medadapt.__version__, result.stderr


def _rendered_help(group) -> str:
    """``group``'s own ``--help`` (this click group object, not one typer builds afresh)."""
    with CliRunner().isolation(env={"COLUMNS": "200"}) as (stdout, _, _):
        with pytest.raises(SystemExit) as exit_:
            group.main(["--help"], prog_name="medadapt")
        assert exit_.value.code == 0
        return stdout.getvalue().decode()


def test_the_lazy_tables_match_the_commands():
    """Each table line is the first paragraph of its command's help, so a group's help is the same before and
    after its commands are imported; the ``data`` group is ``medadapt.cli.data.data_app``'s."""
    root = typer.main.get_command(app)
    data = root.commands["data"]
    assert list(root.commands) == [*medadapt_cli.COMMANDS, "version", "data"]
    before = {"root": _rendered_help(root), "data": _rendered_help(data)}
    assert all(root.commands.pending(name) for name in medadapt_cli.COMMANDS)  # listed, none resolved
    for group, table in ((root, medadapt_cli.COMMANDS), (data, medadapt_cli.DATA_COMMANDS)):
        for name, entry in table.items():
            command = group.commands[name]
            assert command.name == name
            assert command.help.split("\n\n")[0] == one_paragraph_per_block(escape(entry.help)), name
    assert {"root": _rendered_help(root), "data": _rendered_help(data)} == before
    real = typer.main.get_group(cli_data.data_app)
    assert data.help == real.help and list(data.commands) == list(real.commands)
    for name, command in real.commands.items():
        assert [(p.name, p.help) for p in data.commands[name].params] == [(p.name, p.help) for p in command.params]


def test_a_lazy_command_imports_its_module_only_when_it_runs(tmp_path, monkeypatch):
    for name in ("medadapt_fake_a", "medadapt_fake_b"):
        (tmp_path / f"{name}.py").write_text(
            f'def run(count: int = 1) -> None:\n    """Run {name}.\n\n    More."""\n    print("{name}", count)\n')
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = App(name="fake", add_completion=False, lazy_commands={
        "alpha": Lazy("medadapt_fake_a", "run", "Run medadapt_fake_a."),
        "beta": Lazy("medadapt_fake_b", "run", "Run medadapt_fake_b.")})
    runner = CliRunner()
    text = runner.invoke(fake, ["--help"], env={"COLUMNS": "200"}).output
    assert re.search(r"alpha\s+Run medadapt_fake_a\.", text) and re.search(r"beta\s+Run medadapt_fake_b\.", text)
    assert "medadapt_fake_a" not in sys.modules and "medadapt_fake_b" not in sys.modules
    result = runner.invoke(fake, ["alpha", "--count", "3"])
    assert (result.exit_code, result.output) == (0, "medadapt_fake_a 3\n")
    assert "medadapt_fake_a" in sys.modules and "medadapt_fake_b" not in sys.modules
    assert "--count" in runner.invoke(fake, ["beta", "--help"]).output and "medadapt_fake_b" in sys.modules
    result = runner.invoke(fake, ["alpah"])
    assert result.exit_code == 2 and "Did you mean 'alpha'?" in result.output
