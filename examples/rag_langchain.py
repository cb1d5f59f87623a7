"""End-to-end RAG with LangChain over MedQuAD answers, fully offline.

    python examples/rag_langchain.py --question "What are the symptoms of gout?"
    python examples/rag_langchain.py --model path/to/trained-head-model --kind dense

1. Build (or reuse) a hybrid medadapt index over the medquad answers (``--data-dir``, default
   ``../shared/data``) with the packaged MiniLM (``--model``: any alias / saved model folder).
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

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


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
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument("--model", default="minilm", help="alias or saved model folder (e.g. a trained head)")
    p.add_argument("--index", type=Path, default=Path("medquad.index"), help="index folder (built if missing)")
    p.add_argument("--kind", choices=["dense", "lexical", "hybrid"], default="hybrid")
    p.add_argument("--question", default="What are the symptoms of gout?")
    p.add_argument("-k", type=int, default=3)
    args = p.parse_args()

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
    if (args.index / "manifest.json").is_file():
        try:
            retriever = Retriever.load(args.index, model=model)
            if retriever.kind != args.kind:
                retriever = None
        except IndexMismatchError as exc:
            print(f"rebuilding: {exc}")
    if retriever is None:
        docs = load_documents(args.data_dir / "medquad")
        retriever = Retriever.build(docs, model, config=RetrieverConfig(kind=args.kind), model_name=args.model)
        retriever.save(args.index)
    lc = MedAdaptRetriever(retriever=retriever, k=args.k)
    text, docs = answer(args.question, lc, embeddings=MedAdaptEmbeddings(model))
    print(f"Q: {args.question}\n")
    for d in docs:
        print(f"  [{d.metadata['rank']}] {d.id}  {d.metadata['score']:.3f}  {d.metadata['title']}")
    print(f"\nA: {text}")


if __name__ == "__main__":
    main()
