"""Three clients, one number: MedQuAD test nDCG@10 of frozen MiniLM and of the MoE head through
``medadapt eval``, the ``mteb`` package (a local task built from the BEIR folder) and
sentence-transformers' ``InformationRetrievalEvaluator``, side by side.

    python benchmarks/mteb_interop.py --moe /tmp/bench/runs/moe-adapter --encode cache
    python benchmarks/mteb_interop.py --models minilm --clients mteb,st --encode model   # ~17 min per client

``--encode model``: mteb and sentence-transformers encode the corpus themselves (the model's own
``encode_query`` / ``encode_document``): fully independent paths, ~17 min per client and model for the
14,220 MedQuAD answers on a 2-core CPU. ``--encode cache``: they read the same embeddings through
medadapt's embedding cache (mteb through :class:`medadapt.eval.mteb.CachedEncoder`, the ST evaluator
through an ``embed_inputs`` override) and do their own search and scoring: checks the query handling, the
search and the metrics of each client in seconds. Rows are merged into ``--output`` by (dataset, model,
client, encode), so several runs fill one file. ``--dataset medquad-mini --data-dir medadapt/data/builtin``
(1,446 MedQuAD answers, 300 test queries) runs ``--encode model`` in minutes.

MedQuAD's qrels are binary, so the ST evaluator's set-based nDCG equals trec_eval's graded one here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Timer, base_parser, machine, markdown_table

RESULT = Path(__file__).resolve().parent / "results" / "mteb_interop.json"
METRICS = ["ndcg@10", "mrr@10", "recall@10"]


def run_medadapt(model, data, split, cache) -> dict:
    from medadapt.eval import evaluate_retrieval

    return evaluate_retrieval(model, data, split, METRICS, cache=cache, show_progress=False)


def run_mteb_client(model, data, split, cache, encode: str) -> dict:
    from medadapt.eval.mteb import local_retrieval_task, run_mteb

    result = run_mteb(model, local_retrieval_task(data, split), use_cache=encode == "cache", cache=cache,
                      show_progress=False)
    return {m: result["medadapt"][m] for m in METRICS}


def run_st_client(model, data, split, cache, encode: str) -> dict:
    import torch
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    class CachedIREvaluator(InformationRetrievalEvaluator):
        """Embeddings through medadapt's cache (same vectors as the model's encode_query / encode_document)."""

        def embed_inputs(self, model, sentences, encode_fn_name=None, prompt_name=None, prompt=None, **kwargs):
            role = {"query": "query", "document": "document"}.get(encode_fn_name, "plain")
            emb = cache.encode(model, list(sentences), role=role, prompt=prompt, prompt_name=prompt_name,
                               show_progress=False)
            return torch.from_numpy(emb)

    queries = data.split_queries(split)
    corpus = {did: data.doc_text(did) for did in data.doc_ids}
    relevant = {q: {d for d, g in docs.items() if g > 0} for q, docs in data.qrels[split].items()}
    cls = CachedIREvaluator if encode == "cache" else InformationRetrievalEvaluator
    evaluator = cls(queries=queries, corpus=corpus, relevant_docs=relevant, mrr_at_k=[10], ndcg_at_k=[10],
                    accuracy_at_k=[10], precision_recall_at_k=[10], map_at_k=[10], batch_size=64,
                    write_csv=False, name="medquad")
    flat = evaluator(model)  # {"medquad_<similarity>_ndcg@10": ...}, scored with the model's similarity
    sim = model.similarity_fn_name or "cosine"
    return {m: float(next(v for k, v in flat.items() if k.endswith(f"_{sim}_{m}"))) for m in METRICS}


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.set_defaults(output=RESULT)
    p.add_argument("--models", default="minilm,moe", help="comma-separated: minilm, moe")
    p.add_argument("--moe", default="/tmp/bench/runs/moe-adapter", help="trained MoE run folder (adapter or full)")
    p.add_argument("--clients", default="medadapt,mteb,st")
    p.add_argument("--encode", choices=["model", "cache"], default="cache")
    p.add_argument("--split", default="test")
    p.add_argument("--dataset", default="medquad", help="BEIR folder under --data-dir (medquad, medquad-mini ...)")
    args = p.parse_args()

    import medadapt
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir

    data = load_beir(args.data_dir / args.dataset, [args.split])
    cache = EmbeddingCache()
    previous = json.loads(args.output.read_text()) if args.output and args.output.is_file() else {}
    rows = {(r.get("dataset", "medquad"), r["model"], r["client"], r["encode"]): {"dataset": "medquad", **r}
            for r in previous.get("rows", [])}
    for key in [m.strip() for m in args.models.split(",") if m.strip()]:
        path = "minilm" if key == "minilm" else args.moe
        model = medadapt.load(path, device="cpu")
        for client in [c.strip() for c in args.clients.split(",") if c.strip()]:
            encode = "cache" if client == "medadapt" else args.encode
            with Timer() as t:
                if client == "medadapt":
                    scores = run_medadapt(model, data, args.split, cache)
                elif client == "mteb":
                    scores = run_mteb_client(model, data, args.split, cache, encode)
                else:
                    scores = run_st_client(model, data, args.split, cache, encode)
            row = {"dataset": args.dataset, "model": key, "path": path, "client": client, "encode": encode, **scores,
                   "seconds": round(t.seconds, 1), "name": model.model_card_data.model_name,
                   "revision": model.model_card_data.base_model_revision}
            rows[(args.dataset, key, client, encode)] = row
            print(json.dumps(row), flush=True)
            _write(args, list(rows.values()), previous.get("commands", []))
    ordered = sorted(rows.values(), key=lambda r: (r["dataset"], r["model"], r["encode"], r["client"]))
    print(markdown_table(ordered, ["dataset", "model", "client", "encode", *METRICS, "seconds"]))


def _write(args, rows: list[dict], commands: list[str]) -> None:
    import mteb

    from medadapt.io import atomic_write_json

    command = " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    payload = {"commands": [*[c for c in commands if c != command], command], "machine": machine(),
               "mteb": mteb.__version__, "split": args.split, "rows": rows,
               "note": "2-core CPU shared with other jobs: seconds are inflated by contention"}
    atomic_write_json(args.output, payload)


if __name__ == "__main__":
    main()
