"""Train a HyReC lexical + dense model on the builtin medmini set and search it three ways.

    python examples/hyrec_hybrid_search.py                     # ~1-2 min on a laptop CPU
    python examples/hyrec_hybrid_search.py --query "can gout be treated with diet"

Trains ``recipes/hyrec-tiny.yaml`` (packaged MiniLM, GLAE 5 shared + 1 lexicon + 1 dense layer), then puts the
learned sparse document vectors into medadapt's inverted index and the dense ones into a FAISS index, and
prints the top hits of lexical, dense and hybrid (normalised-sum) search with the query's heaviest terms.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--query", default="what are the symptoms of high blood pressure")
    p.add_argument("--output", type=Path, default=Path("runs/hyrec-example"))
    p.add_argument("-k", type=int, default=3)
    args = p.parse_args()

    from medadapt.data import load_beir
    from medadapt.hyrec import HyReCModel
    from medadapt.hyrec.recipe import run_hyrec_recipe
    from medadapt.retrieval.dense import DenseIndex
    from medadapt.retrieval.lexical import LexicalIndex

    if not (args.output / "hyrec" / "config.json").is_file():
        run_hyrec_recipe(ROOT / "recipes" / "hyrec-tiny.yaml", args.output, show_progress=True, evaluate=False)
    model = HyReCModel.load(args.output, device="cpu")

    data = load_beir("medmini", "test")
    ids, texts = list(data.corpus), data.doc_texts()
    lexical = LexicalIndex.from_sparse(model.encode_lexical(texts, role="document"), n_terms=model.n_terms)
    dense = DenseIndex.build(np.ascontiguousarray(model.encode_dense(texts, role="document"), dtype=np.float32))

    q_lex = model.encode_lexical([args.query], role="query")
    print(f"query: {args.query}\nheaviest terms: {model.decode(q_lex[0], top=6)}")
    lex_scores, lex_idx = lexical.search(q_lex, k=len(texts))
    den_scores, den_idx = dense.search(model.encode_dense([args.query], role="query"), len(texts))
    lex = {int(i): float(s) for s, i in zip(lex_scores[0], lex_idx[0]) if i >= 0}
    den = {int(i): float(s) for s, i in zip(den_scores[0], den_idx[0]) if i >= 0}
    # HyReC's NM sum: both sides are L2-normalised vectors, so their dot products are comparable (eq. 9)
    hybrid = {i: lex.get(i, 0.0) + den.get(i, 0.0) for i in set(lex) | set(den)}
    for name, scores in (("lexical", lex), ("dense", den), ("hybrid", hybrid)):
        print(f"\n{name}:")
        for i in sorted(scores, key=lambda j: -scores[j])[: args.k]:
            print(f"  {scores[i]:.3f}  {ids[i]}  {texts[i][:90]!r}")
    assert np.isfinite(list(hybrid.values())).all()


if __name__ == "__main__":
    main()
