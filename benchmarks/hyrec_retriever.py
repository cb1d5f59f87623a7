"""A trained HyReC model through the RAG Retriever vs its own evaluation (issue #6, retrieval path).

    OMP_NUM_THREADS=1 python benchmarks/hyrec_retriever.py --dataset zh-med-qa \
        --model runs/bench-hyrec/zh-med-qa --output benchmarks/results/hyrec-retriever-zh.json

Builds ``Retriever(kind="hybrid", fusion=sum)`` from the model folder (learned sparse vectors in the inverted
index, dense vectors in FAISS Flat), searches the test queries at depth 100 with each kind, and prints
nDCG@10 / Recall@100 and search time. The hybrid ranks by ``S_lex + w S_den`` with ``w`` the model's own
``dense_weight`` (``--dense-weight`` overrides it; 0.25 for the zh recipe). Compare with
``benchmarks/hyrec.py``'s rows for the same model: all three should match, since the Retriever's ``sum``
hybrid rescores every candidate of both top-100 lists exactly, as the evaluation does.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish  # noqa: E402

METRICS = ["ndcg@10", "recall@100"]


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--dataset", default="zh-med-qa")
    p.add_argument("--model", type=Path, required=True, help="a saved HyReC model folder")
    p.add_argument("--dense-weight", type=float, default=None, help="default: the model's dense_weight")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from medadapt.data import load_beir
    from medadapt.eval.metrics import evaluate_run
    from medadapt.retrieval import FusionConfig, Retriever, RetrieverConfig, load_documents

    data = load_beir(args.data_dir / args.dataset, ["test"])
    t0 = time.perf_counter()
    if args.dense_weight is None:
        from medadapt.hyrec.model import HyReCModel

        args.dense_weight = HyReCModel.load(args.model, device="cpu").config.dense_weight
    fusion = FusionConfig(method="sum", dense_weight=args.dense_weight, depth=100)
    retriever = Retriever.build(load_documents(args.data_dir / args.dataset), model=str(args.model),
                                config=RetrieverConfig(kind="hybrid", fusion=fusion), show_progress=True)
    build_s = time.perf_counter() - t0
    qids = list(data.split_queries("test"))
    texts = [data.queries[q] for q in qids]
    rows = []
    for kind in ("lexical", "dense", "hybrid"):
        retriever.config = RetrieverConfig(kind=kind, fusion=fusion)
        t0 = time.perf_counter()
        results = retriever.batch_search(texts, k=100)
        seconds = time.perf_counter() - t0
        run = {q: dict(zip(r.ids, r.scores)) for q, r in zip(qids, results)}
        rows.append({"dataset": args.dataset, "kind": kind, **evaluate_run(data.qrels["test"], run, METRICS),
                     "queries": len(qids), "search s": round(seconds, 2)})
        print(rows[-1], flush=True)
    finish(args, rows, ["dataset", "kind", *METRICS, "queries", "search s"],
           {"model": str(args.model), "dense_weight": args.dense_weight, "build_seconds": round(build_s, 1)})


if __name__ == "__main__":
    main()
