"""Diversity-aware dedup (CARE Appendix B) on the zh-med-qa questions (and answers) with the packaged
all-MiniLM-L6-v2, through the medadapt embedding cache.

    python benchmarks/dedup.py --output benchmarks/results/dedup.json

Rows: the paper's defaults (k=5, m=1, 5,000 seed items; τ=0.85 for queries, τ=0.78 for documents) and,
because zh-med-qa is small (7.6k questions, so 5,000 seeds leave only ~2.6k items checked), the same rule
with no seed set and with m=0. ``dedup_s`` is the dedup time alone; ``encode_s`` is ~0 when the texts were
already cached. MiniLM is an English model, so on Chinese text its similarities run high: the absolute
kept fractions say more about the encoder than about the data.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Timer, base_parser, finish  # noqa: E402


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--dataset", default="zh-med-qa")
    p.add_argument("--model", default="minilm")
    p.add_argument("--documents", action="store_true", help="also deduplicate the corpus (answers)")
    p.add_argument("--batch-size", type=int, default=2048, help="dedup batch size")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from medadapt.cache import EmbeddingCache
    from medadapt.curation import DedupConfig, diversity_dedup
    from medadapt.data import load_beir
    from medadapt.models import load

    data = load_beir(args.data_dir / args.dataset)
    model = load(args.model)
    cache = EmbeddingCache()
    sets = [("queries", "query", list(data.queries.values()), DedupConfig.for_queries)]
    if args.documents:
        sets.append(("documents", "document", data.doc_texts(), DedupConfig.for_documents))
    rows = []
    for name, role, texts, make in sets:
        with Timer() as enc:
            emb = cache.encode(model, texts, role=role, show_progress=True, desc=f"encoding {name}")
        variants = [("paper defaults", {}), ("no seed set", {"seed_size": 0}),
                    ("no seed set, m=0", {"seed_size": 0, "max_neighbors": 0})]
        for label, overrides in variants:
            config = make(batch_size=args.batch_size, **overrides)
            with Timer() as t:
                res = diversity_dedup(emb, config, show_progress=False)
            rows.append({
                "items": name, "setting": label, "k": config.k, "tau": f"{config.threshold:.2f}",
                "m": config.max_neighbors, "seed": res.seed_size, "total": len(texts), "kept": res.n_kept,
                "discarded": res.n_discarded, "kept_pct": f"{100 * res.n_kept / len(texts):.1f}",
                "encode_s": f"{enc.seconds:.1f}", "dedup_s": f"{t.seconds:.2f}",
            })
    finish(args, rows, ["items", "setting", "k", "tau", "m", "seed", "total", "kept", "discarded", "kept_pct",
                        "encode_s", "dedup_s"], {"dataset": args.dataset, "model": args.model})
    return 0


if __name__ == "__main__":
    sys.exit(main())
