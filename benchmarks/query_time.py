"""Query-time cost of trained folders against the frozen packaged MiniLM (issue #14).

    python benchmarks/query_time.py --run composed=runs/care-query-ft-moe-hybrid \
        --output benchmarks/results/query_time.json

Encodes the first ``--queries`` questions of the split (batch 64, best of ``--repeats``) with frozen
all-MiniLM-L6-v2 and with each ``--run LABEL=RUN``: a folder with ``hyrec/`` (a composed dense + learned-lexical
model) is timed as it serves a hybrid query (dense vector and sparse vector), any other folder through
``encode_query``. Only the ratios mean something on a shared machine.
"""

from __future__ import annotations

from _common import base_parser, best_time, finish


def main() -> None:
    ap = base_parser(__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", default=[], metavar="LABEL=RUN")
    ap.add_argument("--dataset", default="medquad", help="a BEIR folder under --data-dir")
    ap.add_argument("--split", default="test")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    bad = [r for r in args.run if "=" not in r]
    if bad:
        ap.error(f"--run takes LABEL=RUN, got {bad}")

    import medadapt
    from medadapt.data import load_beir
    from medadapt.hyrec.model import HyReCModel
    from medadapt.retrieval.encoders import offers_sparse

    data = load_beir(args.data_dir / args.dataset, [args.split])
    queries = [data.queries[q] for q in sorted(data.qrels[args.split])][: args.queries]
    encoders = {"frozen all-MiniLM-L6-v2": medadapt.load("minilm", device="cpu").encode_query}
    for item in args.run:
        label, _, path = item.partition("=")
        if offers_sparse(path):  # a model with a learned-lexical branch
            model = HyReCModel.load(path, device="cpu")
            encoders[f"{label} (dense + sparse)"] = (
                lambda texts, model=model: model.encode(texts, "query", lexical=True, dense=True, batch_size=64))
        else:
            encoders[label] = medadapt.load(path, device="cpu").encode_query
    rows = []
    for label, encode in encoders.items():
        seconds = best_time(lambda encode=encode: encode(queries), args.repeats, warmup=True)
        rows.append({"model": label, "ms/query": 1000 * seconds / len(queries)})
    for row in rows:
        row["x frozen"] = row["ms/query"] / rows[0]["ms/query"]
    finish(args, rows, ["model", "ms/query", "x frozen"], {"queries": len(queries), "split": args.split})


if __name__ == "__main__":
    main()
