"""Train a HyReC lexical + dense model and search MedQuAD answers three ways.

    python examples/hyrec_hybrid_search.py                     # builtin medquad-mini answers
    python examples/hyrec_hybrid_search.py --query "how is marfan syndrome diagnosed"
    python examples/hyrec_hybrid_search.py --medquad ../shared/data/medquad   # all 14,220 MedQuAD answers

Trains ``recipes/hyrec-tiny.yaml`` (packaged MiniLM, GLAE 5 shared + 1 lexicon + 1 dense layer; a smoke-size
recipe on the builtin medmini set), then builds one hybrid medadapt ``Retriever`` index from the model folder
over the answers of the builtin ``medquad-mini`` set (1,446 answers, one encoding pass). About 5 CPU-minutes
in all (measured with 2 threads on a shared machine: expect 3-5 minutes on a 2-core laptop); a rerun skips
the training. ``--medquad PATH`` indexes a full MedQuAD BEIR folder instead (14,220 answers, about ten
times longer to encode). The learned sparse document vectors go into the inverted index, the
dense ones into FAISS, and ``FusionConfig(method="sum")`` adds the two normalised scores (HyReC's NM sum,
eq. 9). Prints the query's heaviest terms and the top hits of the lexical side, the dense side and the
hybrid; the saved index reopens with ``Retriever.load`` and plugs into LangChain as ``MedAdaptRetriever``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--query", default="what are the signs of marfan syndrome")
    p.add_argument("--medquad", metavar="PATH", type=Path, default=None,
                   help="the full MedQuAD BEIR folder (e.g. ../shared/data/medquad); default: builtin medquad-mini")
    p.add_argument("--output", type=Path, default=Path("runs/hyrec-example"))
    p.add_argument("-k", type=int, default=3)
    args = p.parse_args()

    from medadapt.hyrec import HyReCModel
    from medadapt.recipes import run_recipe
    from medadapt.retrieval import FusionConfig, Retriever, RetrieverConfig, load_documents
    from medadapt.retrieval.encoders import offers_sparse

    if not offers_sparse(str(args.output)):  # no trained HyReC model there yet
        run_recipe(ROOT / "recipes" / "hyrec-tiny.yaml", args.output, show_progress=True, evaluate=False)
    model = HyReCModel.load(args.output, device="cpu")
    print(f"query: {args.query}\nheaviest terms: "
          f"{model.decode(model.encode_lexical([args.query], role='query')[0], top=6)}")

    docs = load_documents(args.medquad or "medquad-mini")
    fusion = FusionConfig(method="sum", dense_weight=model.config.dense_weight)
    hybrid = Retriever.build(docs, model=model, config=RetrieverConfig(kind="hybrid", fusion=fusion),
                             model_name=str(args.output))  # one encoding pass fills both sides
    views = {  # the two sides of the same index on their own
        "lexical": Retriever(RetrieverConfig(kind="lexical"), hybrid.ids, hybrid.docstore, model,
                             lexical=hybrid.lexical),
        "dense": Retriever(RetrieverConfig(kind="dense"), hybrid.ids, hybrid.docstore, model, dense=hybrid.dense),
        "hybrid": hybrid,
    }
    for kind, retriever in views.items():
        print(f"\n{kind}:")
        for hit in retriever.search(args.query, k=args.k):
            print(f"  {hit.score:.3f}  {hit.id}  {hit.text[:90]!r}")
    hybrid.save(args.output / "hybrid.index")  # Retriever.load(...) reloads the model from args.output


if __name__ == "__main__":
    main()
