"""The LangChain retriever refuses an empty, blank or non-string query with one DataError before the wrapped
retriever sees it (issue 43: "an empty LangChain query" was silently searched), sync and async alike."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core")

from medadapt.errors import DataError, MedAdaptError  # noqa: E402
from medadapt.retrieval import MedAdaptRetriever  # noqa: E402
from medadapt.retrieval.retriever import SearchResult  # noqa: E402


class _Recording:
    """A retriever that records every search (a real one would encode the query)."""

    kind = "dense"

    def __init__(self):
        self.seen = []

    def search(self, query, k):
        self.seen.append(query)
        return SearchResult(ids=["d1"], scores=[0.5], texts=["gout is a condition"], titles=["gout"])


@pytest.mark.parametrize("query, message", [
    ("", "the query is empty"), ("   ", "the query is empty"), ("\n\t", "the query is empty"),
    (None, "the query must be a string, not NoneType"), (5, "the query must be a string, not int"),
])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_an_empty_or_non_string_query_is_refused_before_searching(query, message, mode):
    inner = _Recording()
    lc = MedAdaptRetriever(retriever=inner, k=3)
    call = lc.invoke if mode == "invoke" else (lambda q: asyncio.run(lc.ainvoke(q)))
    with pytest.raises(DataError) as err:
        call(query)
    assert str(err.value) == message and isinstance(err.value, MedAdaptError)
    assert inner.seen == []
    docs = call("gout toe")  # an ordinary query still goes through
    assert [d.id for d in docs] == ["d1"] and inner.seen == ["gout toe"]
