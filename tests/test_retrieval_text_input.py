"""The text-input policy on the Python API of medadapt.retrieval: ``Documents`` refuses a lone surrogate in an
id, title or text (it would crash hashing later), and every search (``search``, ``batch_search``, LangChain's
``invoke``) refuses an empty or blank query and one holding a lone surrogate with one DataError."""

from __future__ import annotations

import re

import pytest

from medadapt.errors import DataError
from medadapt.retrieval import Documents, Retriever


@pytest.mark.parametrize("where, ids, texts, titles", [
    ("documents[1].text", ["a", "b"], ["gout", "toe \ud800"], None),
    ("documents[0].title", ["a", "b"], ["gout", "toe"], ["\udcff", ""]),
    ("documents[1].id", ["a", "b\udfff"], ["gout", "toe"], None),
])
def test_documents_refuse_lone_surrogates(where, ids, texts, titles):
    with pytest.raises(DataError, match="^" + re.escape(where) + " holds a lone surrogate"):
        Documents(ids, texts, titles)


@pytest.fixture(scope="module")
def lexical() -> Retriever:
    docs = Documents(["a", "b", "c"], ["gout swollen toe", "asthma wheezing", "eczema itchy skin"])
    return Retriever.build(docs, kind="lexical", show_progress=False)


@pytest.mark.parametrize("query, message", [
    ("", r"^the query is empty$"),
    (" \t\n", r"^the query is empty$"),
    ("gout \ud800", r"^the query holds a lone surrogate \(U\+D800 at character 6\)"),
])
def test_search_refuses_empty_and_surrogate_queries(lexical, query, message):
    with pytest.raises(DataError, match=message):
        lexical.search(query, 2)
    with pytest.raises(DataError, match=message.replace("the query", "query 1")):
        lexical.batch_search(["gout", query], 2)
    assert lexical.search("gout toe", 1).ids == ["a"]  # the retriever still works


def test_langchain_empty_query_is_refused(lexical):
    pytest.importorskip("langchain_core")
    from medadapt.retrieval import MedAdaptRetriever

    lc = MedAdaptRetriever(retriever=lexical, k=2)
    with pytest.raises(DataError, match=r"^the query is empty$"):
        lc.invoke("  ")
    assert [d.id for d in lc.invoke("asthma")][0] == "b"
