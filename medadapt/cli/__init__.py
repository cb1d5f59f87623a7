"""The ``medadapt`` command line (Typer + rich).

One module per command (``eval.py``, ...); this file only assembles the app. Every user error
(:class:`medadapt.errors.MedAdaptError`, bad option values) is printed as one ``error: ...`` line on
stderr with exit code 1 and no traceback.
"""

from __future__ import annotations

import sys

import typer

from medadapt import __version__
from medadapt.cli._common import console, err_console, tagged
from medadapt.cli._help import App
from medadapt.cli.data import data_app
from medadapt.cli.encode import encode_cmd
from medadapt.cli.eval import eval_cmd
from medadapt.cli.index import index_app, search_cmd
from medadapt.cli.plan import plan_cmd
from medadapt.cli.report import report_cmd
from medadapt.cli.train import train_cmd
from medadapt.errors import MedAdaptError, MedAdaptWarning
from medadapt.progress import set_level

app = App(
    name="medadapt",
    help="Medical retrieval adapters for Sentence-Transformers: evaluate, train heads, reproduce recipes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("eval")(eval_cmd)
app.command("train")(train_cmd)
app.add_typer(index_app, name="index")
app.command("search")(search_cmd)
app.command("encode")(encode_cmd)
app.command("plan")(plan_cmd)
app.command("report")(report_cmd)
app.add_typer(data_app, name="data")


def _print_version(value: bool) -> None:
    if value:
        console.print(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the medadapt version and exit."),
) -> None:
    """Medical retrieval adapters for Sentence-Transformers."""
    set_level("normal")  # each command's --quiet / --verbose sets it again (one process may run many commands)


@app.command("version")
def version_cmd() -> None:
    """Print the medadapt version."""
    console.print(__version__)


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=None):
    """medadapt's own warnings as one ``warning: ...`` line; others as Python shows them."""
    if issubclass(category, MedAdaptWarning):
        err_console.print(tagged("warning:", "yellow", str(message)), highlight=False, soft_wrap=True)
    else:
        _default(message, category, filename, lineno, file, line)


def main() -> None:
    """Entry point of the ``medadapt`` console script."""
    import functools
    import warnings

    warnings.showwarning = functools.partial(_show_warning, _default=warnings.showwarning)
    try:
        app()
    except MedAdaptError as exc:  # pragma: no cover - raised outside a command body
        err_console.print(tagged("error:", "bold red", str(exc)), highlight=False, soft_wrap=True)
        sys.exit(1)


__all__ = ["app", "main"]
