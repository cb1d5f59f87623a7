"""The CLI's two consoles and :func:`tagged`: what ``medadapt --help`` / ``version`` need, without the
command modules' libraries (torch stays unimported until a command runs).

Everything the CLI prints goes through :data:`console` / :data:`err_console`, which print text as it is
(:func:`medadapt.progress.plain_console`): a query, a document title, an id, a path or a warning holding
``[/bold]``, ``[red]`` or ``[link=x]`` is printed literally, never read as rich markup. Colour comes only
from ``rich.text.Text`` styles (:func:`tagged`)."""

from __future__ import annotations

from rich.text import Text

from medadapt.progress import plain_console

console = plain_console()
err_console = plain_console(stderr=True)


def tagged(tag: str, style: str, message: str) -> Text:
    """``tag message`` with only the tag styled (``tagged("error:", "bold red", message)``): the message,
    whatever brackets it holds, stays literal."""
    return Text.assemble((tag, style), " ", str(message))
