"""End-to-end RAG with LangChain over MedQuAD answers, fully offline.

    python examples/rag_langchain.py --question "What are the symptoms of Marfan syndrome?"
    python examples/rag_langchain.py --model runs/demo --kind dense      # a trained head (the README's main job)
    python examples/rag_langchain.py --medquad ../shared/data/medquad    # all 14,220 MedQuAD answers

Needs ``pip install -e ".[demo]"`` plus langchain-core (and PyStemmer for the BM25 side of ``hybrid``).

1. Build (or reuse) a hybrid medadapt index over the answers of the builtin ``medquad-mini`` set (1,446
   answers: about 2 minutes to encode on a 2-core CPU), or of the full MedQuAD BEIR folder given with
   ``--medquad`` (14,220 answers: about 20 minutes), with the packaged MiniLM (``--model``: any alias /
   saved model folder). The index is saved (``--index``) and reused by later runs.
2. Retrieve through ``MedAdaptRetriever`` (a LangChain ``BaseRetriever``).
3. Answer. The default "LLM" is extractive: the best passage's sentences that are most similar to the
   question (MiniLM embeddings), so the example needs no network. Any LangChain chat model can replace
   it: pass a callable ``llm(question, documents) -> str`` to :func:`answer`.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

def extractive_answer(question: str, documents, embeddings, n_sentences: int = 3) -> str:
    """The ``n_sentences`` sentences of the top document closest to the question, in document order."""
    import numpy as np

    if not documents:
        return "No relevant passage found."
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", documents[0].page_content) if len(s.strip()) > 20]
    if not sentences:
        return documents[0].page_content
    q = np.asarray(embeddings.embed_query(question))
    s = np.asarray(embeddings.embed_documents(sentences))
    best = sorted(np.argsort(-(s @ q))[:n_sentences])
    return " ".join(sentences[i] for i in best)


def answer(question: str, retriever, llm: Callable | None = None, embeddings=None) -> tuple[str, list]:
    docs = retriever.invoke(question)
    if llm is not None:  # e.g. lambda q, d: chat.invoke(prompt.format(q=q, context=d)).content
        return llm(question, docs), docs
    return extractive_answer(question, docs, embeddings), docs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--medquad", metavar="PATH", type=Path, default=None,
                   help="the full MedQuAD BEIR folder (e.g. ../shared/data/medquad); default: builtin medquad-mini")
    p.add_argument("--model", default="minilm", help="alias or saved model folder (e.g. a trained head)")
    p.add_argument("--index", type=Path, default=None,
                   help="index folder, built if missing (default medquad-mini.index, or medquad.index with --medquad)")
    p.add_argument("--kind", choices=["dense", "lexical", "hybrid"], default="hybrid")
    p.add_argument("--question", default="What are the symptoms of Marfan syndrome?")
    p.add_argument("-k", type=int, default=3)
    args = p.parse_args()
    source = args.medquad or "medquad-mini"
    index = args.index or Path("medquad.index" if args.medquad else "medquad-mini.index")

    from medadapt.models import load
    from medadapt.retrieval import (
        IndexMismatchError,
        MedAdaptEmbeddings,
        MedAdaptRetriever,
        Retriever,
        RetrieverConfig,
        load_documents,
    )

    model = load(args.model, device="cpu")
    retriever = None
    docs = load_documents(source)
    if (index / "manifest.json").is_file():
        try:
            retriever = Retriever.load(index, model=model)
            if retriever.kind != args.kind or retriever.manifest.corpus_hash != docs.content_hash():
                retriever = None  # another kind, or built over other documents
        except IndexMismatchError as exc:
            print(f"rebuilding: {exc}")
    if retriever is None:
        retriever = Retriever.build(docs, model, config=RetrieverConfig(kind=args.kind), model_name=args.model)
        retriever.save(index)
    lc = MedAdaptRetriever(retriever=retriever, k=args.k)
    text, docs = answer(args.question, lc, embeddings=MedAdaptEmbeddings(model))
    print(f"Q: {args.question}\n")
    for d in docs:
        print(f"  [{d.metadata['rank']}] {d.id}  {d.metadata['score']:.3f}  {d.metadata['title']}")
    print(f"\nA: {text}")


if __name__ == "__main__":
    main()
