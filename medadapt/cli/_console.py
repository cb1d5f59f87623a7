"""The CLI's two consoles and :func:`tagged` (importing no torch). They print text as it is (a query or path
holding ``[/bold]`` is never read as rich markup); colour comes only from ``rich.text.Text`` styles."""

from __future__ import annotations

from rich.text import Text

from medadapt.progress import plain_console

console = plain_console()
err_console = plain_console(stderr=True)


def tagged(tag: str, style: str, message: str) -> Text:
    """``tag message`` with only the tag styled (``tagged("error:", "bold red", message)``): the message,
    whatever brackets it holds, stays literal."""
    return Text.assemble((tag, style), " ", str(message))
