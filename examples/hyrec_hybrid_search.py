"""Train a HyReC lexical + dense model on the builtin medmini set and search it three ways.

    python examples/hyrec_hybrid_search.py                     # ~1-2 min on a laptop CPU
    python examples/hyrec_hybrid_search.py --query "can gout be treated with diet"

Trains ``recipes/hyrec-tiny.yaml`` (packaged MiniLM, GLAE 5 shared + 1 lexicon + 1 dense layer), then builds
medadapt ``Retriever`` indexes from the model folder: ``lexical`` puts the learned sparse document vectors
into the inverted index, ``dense`` the dense ones into FAISS, and ``hybrid`` with ``FusionConfig(method="sum")``
adds the two normalised scores (HyReC's NM sum, eq. 9). Prints the query's heaviest terms and the top hits of
each; the saved index reopens with ``Retriever.load`` and plugs into LangChain as ``MedAdaptRetriever``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--query", default="what are the symptoms of high blood pressure")
    p.add_argument("--output", type=Path, default=Path("runs/hyrec-example"))
    p.add_argument("-k", type=int, default=3)
    args = p.parse_args()

    from medadapt.hyrec import HyReCModel
    from medadapt.recipes import run_recipe
    from medadapt.retrieval import FusionConfig, Retriever, RetrieverConfig, load_documents

    if not (args.output / "hyrec" / "config.json").is_file():
        run_recipe(ROOT / "recipes" / "hyrec-tiny.yaml", args.output, show_progress=True, evaluate=False)
    model = HyReCModel.load(args.output, device="cpu")
    print(f"query: {args.query}\nheaviest terms: "
          f"{model.decode(model.encode_lexical([args.query], role='query')[0], top=6)}")

    docs = load_documents("medmini")
    for kind in ("lexical", "dense", "hybrid"):
        config = RetrieverConfig(kind=kind, fusion=FusionConfig(method="sum", dense_weight=model.config.dense_weight))
        retriever = Retriever.build(docs, model=model, config=config, model_name=str(args.output),
                                    show_progress=False)
        print(f"\n{kind}:")
        for hit in retriever.search(args.query, k=args.k):
            print(f"  {hit.score:.3f}  {hit.id}  {hit.text[:90]!r}")
    retriever.save(args.output / "hybrid.index")  # Retriever.load(...) reloads the model from args.output


if __name__ == "__main__":
    main()
