"""What the CLI prints is text, never rich markup (issue 43 item 3): a query, a document id or title, a model
path, a warning or a progress description holding ``[/bold]``, ``[red]``, ``[link=x]`` or ``:pill:`` is
printed as it is, and the command ends with exit code 0 (``[/bold]`` used to raise ``MarkupError``)."""

from __future__ import annotations

import shutil
import warnings

import pytest
from typer.testing import CliRunner

import medadapt.cli._common as common
import medadapt.progress as prog
from medadapt.cli import _show_warning, app
from medadapt.errors import MedAdaptWarning
from medadapt.retrieval import Retriever, load_documents
from medadapt.tiny import TOPICS, write_beir

pytestmark = pytest.mark.usefixtures("_single_thread")

#: Each would be markup (or an emoji code) to rich: a closing tag with no opening one raises MarkupError.
MARKUP = ["[/bold]", "[red]", "[link=x]", "[bold red]x[/]", ":pill:", "\\[/]"]


@pytest.fixture(autouse=True)
def _wide_consoles(tmp_path, monkeypatch):
    """Wide consoles (no cell cut short with an ellipsis) and a cache of the test's own."""
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    for console in (common.console, common.err_console):
        monkeypatch.setattr(console, "_width", 1000)


def _beir_with(root, text: str):
    """The tiny BEIR set with ``text`` in document ``d0``'s id and title, and in query ``q0``."""
    corpus = {f"d{i}": (name, f"{name} is a condition with {words}.") for i, (name, words) in enumerate(TOPICS)}
    del corpus["d0"]
    doc_id = "d0" + text.replace(" ", "-")  # ids hold no whitespace
    corpus[doc_id] = (f"diabetes {text} title", "diabetes is a condition with blood sugar insulin thirst.")
    queries = {f"q{i}": f"symptoms of {name}" for i, (name, _) in enumerate(TOPICS)}
    queries["q0"] = f"diabetes {text} insulin"
    test = {f"q{i}": {f"d{i}": 1} for i in range(1, len(TOPICS))}
    test["q0"] = {doc_id: 1}
    return write_beir(root, corpus, queries, {"test": test}), doc_id


@pytest.mark.parametrize("text", MARKUP)
def test_search_and_eval_print_markup_literally(text, tiny_bert_dir, tmp_path):
    model = tmp_path / f"model{text}"  # a model path holding the text too
    shutil.copytree(tiny_bert_dir, model)
    data, doc_id = _beir_with(tmp_path / "beir", text)
    index = tmp_path / "idx"
    Retriever.build(load_documents(data), model=str(model), kind="dense", show_progress=False).save(index)
    runner = CliRunner()

    query = f"diabetes {text} insulin"
    res = runner.invoke(app, ["search", "--index", str(index), "-k", "12", "-q", query])
    assert res.exit_code == 0, res.output
    assert f"top 12 for: {query}" in res.output  # the table title
    assert doc_id in res.output and f"diabetes {text} title" in res.output  # an id and a title cell

    res = runner.invoke(app, ["eval", "--model", str(model), "--data", str(data), "--split", "test", "-q"])
    assert res.exit_code == 0, res.output
    assert f"{model.name} on beir/test" in res.output  # the results table names the model folder


@pytest.mark.parametrize("text", MARKUP)
def test_errors_and_warnings_print_markup_literally(text, tmp_path, capsys):
    res = CliRunner().invoke(app, ["search", "--index", str(tmp_path / f"no{text}"), "gout"])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"no{text}" in lines[0], res.output

    _show_warning(MedAdaptWarning(f"shard {text} moved aside"), MedAdaptWarning, "x.py", 1,
                  _default=warnings.showwarning)
    assert capsys.readouterr().err.strip() == f"warning: shard {text} moved aside"


@pytest.mark.parametrize("text", MARKUP)
def test_progress_descriptions_and_infos_are_literal(text, capsys):
    prog.set_level("normal")
    with prog.progress(total=2, desc=f"encoding {text}", unit=text) as bar:
        bar.update(1)
        bar.set_info(f"loss {text}")
        bar.set_state(2, desc=f"training ({text})")
    err = capsys.readouterr().err
    assert f"training ({text})" in err and f"loss {text}" in err, err  # drawn when the display stopped
    assert prog._SHARED is None


def test_library_tables_hold_literal_text():
    """Tables the Python API returns print literally on any console, one that reads markup included."""
    from rich.console import Console

    from medadapt.eval import results_table

    console = Console(width=200, record=True, color_system=None)  # markup on: rich's default
    console.print(results_table({"run[/bold]": {"ndcg@10": 0.5}}, "task[red]", title="t[link=x]"))
    text = console.export_text()
    assert "run[/bold]" in text and "task[red]" in text and "t[link=x]" in text
