"""Baselines on the shared medical datasets, one run: BM25 (bm25s) and the frozen packaged
all-MiniLM-L6-v2, test splits of medquad and zh-med-qa, metrics from pytrec_eval.

    python benchmarks/eval_baselines.py --output benchmarks/results/eval_baselines.json

English BM25 uses bm25s' tokenizer with English stopwords and the Snowball stemmer (PyStemmer);
Chinese BM25 tokenises with jieba's search mode. Dense encoding goes through the medadapt embedding
cache: ``encode_s`` is 0-ish when the corpus was already cached (the ``cached`` column says so).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Timer, base_parser, finish  # noqa: E402

METRICS = ["ndcg@10", "recall@100", "mrr@10", "map@10"]
def is_chinese(texts: list[str]) -> bool:
    from medadapt.retrieval.tokenize import detect_language

    return detect_language(texts) == "zh"


def bm25_run(data, split: str, k: int = 100):
    import bm25s

    doc_texts = data.doc_texts()
    queries = data.split_queries(split)
    qids = list(queries)
    if is_chinese(doc_texts):
        import jieba

        jieba.setLogLevel(60)

        def tok(texts):
            return [[w for w in jieba.lcut_for_search(t) if w.strip()] for t in texts]

        corpus_tokens, query_tokens = tok(doc_texts), tok([queries[q] for q in qids])
    else:
        import Stemmer

        stemmer = Stemmer.Stemmer("english")
        corpus_tokens = bm25s.tokenize(doc_texts, stopwords="en", stemmer=stemmer, show_progress=False)
        query_tokens = bm25s.tokenize([queries[q] for q in qids], stopwords="en", stemmer=stemmer,
                                      show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(corpus_tokens, show_progress=False)
    if isinstance(query_tokens, list):
        docs, scores = retriever.retrieve(query_tokens, k=k, show_progress=False)
    else:
        docs, scores = retriever.retrieve(query_tokens, k=k, show_progress=False)
    ids = data.doc_ids
    return {q: {ids[int(d)]: float(s) for d, s in zip(docs[i], scores[i])} for i, q in enumerate(qids)}


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--datasets", default="medquad,zh-med-qa")
    p.add_argument("--split", default="test")
    p.add_argument("--model", default="minilm")
    args = p.parse_args()

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval, evaluate_run
    from medadapt.models import load

    model = load(args.model, device="cpu")
    cache = EmbeddingCache()
    rows = []
    for name in args.datasets.split(","):
        data = load_beir(args.data_dir / name, [args.split])
        with Timer() as t:
            run = bm25_run(data, args.split)
        rows.append({"dataset": name, "method": "BM25 (bm25s)", **evaluate_run(data.qrels[args.split], run, METRICS),
                     "seconds": round(t.seconds, 1), "cached": "-"})
        cached = cache.count_missing(model, data.doc_texts(), role="document") == 0
        with Timer() as t:
            res = evaluate_retrieval(model, data, args.split, METRICS, cache=cache, show_progress=True)
        rows.append({"dataset": name, "method": f"frozen {args.model}", **res, "seconds": round(t.seconds, 1),
                     "cached": "yes" if cached else "no"})
    finish(args, rows, ["dataset", "method", *METRICS, "seconds", "cached"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
