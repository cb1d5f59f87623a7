"""A corpus (a BEIR folder, a ``corpus.jsonl`` file or a builtin name) as
:class:`~medadapt.retrieval.docstore.Documents`."""

from __future__ import annotations

from pathlib import Path

from medadapt.data import builtin_names, load_corpus, resolve_data_dir
from medadapt.errors import DataError
from medadapt.retrieval.docstore import Documents


def load_documents(source: str | Path) -> Documents:
    """Load a corpus (``{"_id", "title"?, "text"}`` per line); a missing or malformed one is a DataError."""
    path = resolve_data_dir(source)
    if path.is_dir():
        path = path / "corpus.jsonl"
        if not path.is_file():
            raise DataError(f"no corpus.jsonl in {path.parent} (expected a BEIR folder, a corpus.jsonl or 'medmini')")
    elif not path.is_file():
        raise DataError(f"corpus not found: {source} (expected a BEIR folder, a corpus.jsonl or a builtin "
                        f"dataset: {', '.join(builtin_names())})")
    corpus = load_corpus(path)
    return Documents(list(corpus), [d["text"] for d in corpus.values()], [d["title"] for d in corpus.values()])
