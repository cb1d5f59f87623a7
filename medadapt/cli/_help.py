"""How every ``medadapt`` command renders its ``--help`` (:class:`App`): help strings are paragraphs the
terminal wraps (Typer keeps a docstring's line breaks), printed literally (not read as rich markup), and flags
show no ``<bool>`` type. A group may hold its commands as a table of :class:`Lazy` entries: a command's module
is imported only when it runs or shows its own help, so ``medadapt --help`` does not import torch.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import typer
from rich.markup import escape
from typer.core import DEFAULT_MARKUP_MODE, TyperCommand, TyperGroup
from typer.models import CommandInfo

if TYPE_CHECKING:  # typer's own (vendored) click
    from typer._click import Command as ClickCommand
    from typer._click import Context, HelpFormatter

#: ``medadapt data``'s settings, shared by the lazy group of the root app and ``medadapt.cli.data.data_app``.
DATA_GROUP = {"name": "data", "no_args_is_help": True, "pretty_exceptions_enable": False, "add_completion": False,
              "help": "Curate training data: hard negatives, consistency filter, diversity dedup, LLM consensus "
                      "labels, synonym STS triplets."}
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def one_paragraph_per_block(text: str | None) -> str | None:
    """``text`` with the line breaks inside each paragraph turned into spaces (paragraphs stay apart)."""
    if not text:
        return text
    blocks = _PARAGRAPH_BREAK.split(text.strip())
    return "\n\n".join(" ".join(line.strip() for line in block.splitlines() if line.strip()) for block in blocks)


def _literal(text: str | None) -> str | None:
    return escape(one_paragraph_per_block(text)) if text else text


class _PlainHelp:
    """Mixin: normalise the command's and its parameters' help once, hide flags' type placeholder."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.help = _literal(self.help)
        self.short_help = _literal(self.short_help)
        for param in self.params:
            _plain_param(param)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            _plain_param(option)
        return option


def _plain_param(param) -> None:
    if getattr(param, "_medadapt_plain", False):
        return
    param._medadapt_plain = True
    if getattr(param, "help", None):
        param.help = _literal(param.help)
    if getattr(param, "is_flag", False) and param.metavar is None:
        param.metavar = ""  # rich help shows the metavar as the type column: nothing for a flag


class Command(_PlainHelp, TyperCommand):
    """A Typer command whose help follows the rules of this module."""


class Group(_PlainHelp, TyperGroup):
    """A Typer group (``medadapt``, ``medadapt index``, ``medadapt data``) following the same rules."""


class Lazy(NamedTuple):
    """Where a command lives, and the line its group's help shows for it (the first paragraph of its help).
    ``attribute`` names a command function or a ``typer.Typer`` (a group)."""

    module: str
    attribute: str
    help: str


def resolve(name: str, entry: Lazy, markup_mode=DEFAULT_MARKUP_MODE) -> ClickCommand:
    """Import ``entry.module`` and build the click command (or group) ``name`` from ``entry.attribute``."""
    target = getattr(importlib.import_module(entry.module), entry.attribute)
    if isinstance(target, typer.Typer):
        command = typer.main.get_group(target)
    else:
        command = typer.main.get_command_from_info(CommandInfo(name=name, callback=target, cls=Command),
                                                   pretty_exceptions_short=True, rich_markup_mode=markup_mode)
    command.name = name
    return command


class _LazyCommands(MutableMapping):
    """A group's ``commands``: the eager ones plus the table's, each table entry resolved on first access;
    iterating (names) imports nothing."""

    def __init__(self, eager: Mapping[str, ClickCommand], table: Mapping[str, Lazy], markup_mode) -> None:
        self.table = dict(table)
        self.resolved: dict[str, ClickCommand] = dict(eager)
        self.markup_mode = markup_mode

    def pending(self, name: str) -> bool:
        return name in self.table and name not in self.resolved

    def __getitem__(self, name: str) -> ClickCommand:
        if self.pending(name):
            self.resolved[name] = resolve(name, self.table[name], self.markup_mode)
        return self.resolved[name]

    def __setitem__(self, name: str, command: ClickCommand) -> None:
        self.resolved[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self.table.pop(name, None)
        self.resolved.pop(name, None)

    def __contains__(self, name: object) -> bool:  # without resolving
        return name in self.table or name in self.resolved

    def __iter__(self) -> Iterator[str]:
        yield from self.table
        yield from (name for name in self.resolved if name not in self.table)

    def __len__(self) -> int:
        return len(self.table.keys() | self.resolved.keys())


class LazyGroup(Group):
    """A :class:`Group` whose :attr:`lazy_commands` are imported when resolved (run, or their own ``--help``);
    its own help lists them from the table, importing nothing."""

    lazy_commands: ClassVar[Mapping[str, Lazy]] = {}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(self.commands, self.lazy_commands, self.rich_markup_mode)
        self._listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)  # names only (the base class reads every command)

    def get_command(self, ctx: Context, cmd_name: str) -> ClickCommand | None:
        if self._listing and self.commands.pending(cmd_name):  # a row of this group's help
            return Command(name=cmd_name, help=self.commands.table[cmd_name].help)
        return super().get_command(ctx, cmd_name)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


class App(typer.Typer):
    """``typer.Typer`` whose groups are :class:`Group` and whose commands are :class:`Command`;
    ``lazy_commands`` (name -> :class:`Lazy`, in help order) makes the group a :class:`LazyGroup`."""

    def __init__(self, *, lazy_commands: Mapping[str, Lazy] | None = None, **kwargs) -> None:
        if lazy_commands:
            kwargs.setdefault("cls", type("LazyGroup", (LazyGroup,), {"lazy_commands": dict(lazy_commands)}))
            kwargs.setdefault("callback", _no_options)  # a group even with no eager command
        kwargs.setdefault("cls", Group)
        super().__init__(**kwargs)

    def command(self, name: str | None = None, *, cls=None, **kwargs):
        return super().command(name, cls=cls or Command, **kwargs)


def _no_options() -> None:
    """A lazy group's callback when it has none: it has only its commands' options."""

