"""How every ``medadapt`` command renders its ``--help``: help strings are logical paragraphs the terminal
wraps, printed literally, and boolean flags show as plain ``--flag`` / ``--flag/--no-flag``.

Typer's rich help keeps the single line breaks of a triple-quoted docstring (so sentences break at the
source's line length), reads help text as rich markup (``openai:MODEL[@BASE_URL]`` lost its bracket part)
and prints a ``<bool>`` type beside every flag. :class:`App` builds commands and groups that fix all three.
"""

from __future__ import annotations

import re

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

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


class App(typer.Typer):
    """``typer.Typer`` whose groups are :class:`Group` and whose commands are :class:`Command`."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("cls", Group)
        super().__init__(**kwargs)

    def command(self, name: str | None = None, *, cls=None, **kwargs):
        return super().command(name, cls=cls or Command, **kwargs)
