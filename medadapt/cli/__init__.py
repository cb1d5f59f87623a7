"""The ``medadapt`` command line (Typer + rich): one module per command, assembled here from a table of where
each lives (:data:`COMMANDS`), imported only when it runs, so ``medadapt --help`` answers at once. A user error
is one ``error: ...`` line on stderr, exit code 1, no traceback.
"""

from __future__ import annotations

import sys

import typer

from medadapt import __version__
from medadapt.cli._console import console, err_console, tagged
from medadapt.cli._help import DATA_GROUP, App, Lazy
from medadapt.errors import MedAdaptError, MedAdaptWarning
from medadapt.progress import set_level

#: ``medadapt <command>`` -> where it lives and the line ``medadapt --help`` shows for it (the first paragraph
#: of its help; ``tests/test_cli_help.py`` checks that the two agree).
COMMANDS = {
    "eval": Lazy("medadapt.cli.eval", "eval_cmd",
                 "Evaluate a model or an index on retrieval (nDCG/Recall/MRR/MAP@k), rerank (MAP@10), STS "
                 "(Pearson/Spearman), QA (Recall@5/20, nDCG@20), entity linking (Recall@1/5, MRR@5) or paper "
                 "recommendation (MAP, nDCG)."),
    "train": Lazy("medadapt.cli.train", "train_cmd",
                  "Train a head (or backbone / LoRA) as a recipe describes; resumes from OUTPUT.checkpoints after "
                  "a kill."),
    "search": Lazy("medadapt.cli.index", "search_cmd",
                   "Search an index: one query as a table, or --queries as a TREC run (qid Q0 docid rank score "
                   "tag)."),
    "encode": Lazy("medadapt.cli.encode", "encode_cmd",
                   "Encode a corpus into the embedding cache (resumable; split across `accelerate launch` "
                   "processes)."),
    "plan": Lazy("medadapt.cli.plan", "plan_cmd",
                 "Plan a recipe before any download: parameters (trainable / frozen), memory per device, tokens "
                 "per optimizer step and the gradient accumulation the paper's global batch needs; exit 1 with "
                 "the reason when it cannot fit."),
    "report": Lazy("medadapt.cli.report", "report_cmd",
                   "Write an HTML report of a training run: loss curves, expert load, positive vs hard-negative "
                   "scores, metrics vs the frozen baseline, and the queries that gained or lost most."),
    "index": Lazy("medadapt.cli.index", "index_app",
                  "Build a dense, lexical or hybrid index over a corpus and save it as a checked folder (`medadapt "
                  "index upgrade-queries`: give a built index a new query encoder)."),
}
#: ``medadapt data <command>``, likewise.
DATA_COMMANDS = {
    "mine": Lazy("medadapt.cli.data", "mine_cmd",
                 "Mine hard negatives by rank window; write FlagEmbedding JSONL {query, pos, neg, *_scores}."),
    "filter": Lazy("medadapt.cli.data", "filter_cmd",
                   "Consistency filter (BMRetriever): keep synthetic pairs whose passage ranks in the retriever's "
                   "top-k."),
    "dedup": Lazy("medadapt.cli.data", "dedup_cmd",
                  "Diversity-aware dedup (CARE App. B): stream into an index; drop items with > m neighbours above "
                  "τ."),
    "label": Lazy("medadapt.cli.data", "label_cmd",
                  "Multi-judge consensus labels (CMedTEB): keep pairs the judges agree on; report Fleiss' kappa."),
    "sts-triplets": Lazy("medadapt.cli.data", "sts_cmd",
                         "Synonym STS data (CMedTEB): positive / hard-negative / easy-negative sentences per "
                         "synonym pair."),
}

app = App(
    name="medadapt",
    help="Medical retrieval adapters for Sentence-Transformers: evaluate, train heads, reproduce recipes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    lazy_commands=COMMANDS,
)
#: ``medadapt data``: the same group as ``medadapt.cli.data.data_app``, its commands from :data:`DATA_COMMANDS`.
data_app = App(**DATA_GROUP, lazy_commands=DATA_COMMANDS)
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
