"""Residual scale vs transfer (issue 40): a domain-routed MoE head trained on a leave-one-source-out fold
(``benchmarks/loso.py --moe-recipe recipes/medical-multidomain-dense.yaml``), scored with domain routing off at each
residual scale on the fold's dev (in-source, what domain routing chooses on), test-in and test-out (the held-out
source), beside the routed model.

    python benchmarks/scale_transfer.py --runs /tmp/medadapt-loso-md/runs --folds /tmp/medadapt-loso-md/folds \
        --sources 2_GARD_QA,5_NIDDK_QA --output benchmarks/results/scale_transfer.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish  # noqa: E402

import medadapt  # noqa: E402
from medadapt.cache import EmbeddingCache  # noqa: E402
from medadapt.data import load_beir  # noqa: E402
from medadapt.eval.retrieval import evaluate_retrieval  # noqa: E402
from medadapt.moe.head import MoEHead  # noqa: E402

SPLITS = ("dev", "test-in", "test-out")


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, required=True, help="loso.py's <work>/runs (moe-<source> folders)")
    p.add_argument("--folds", type=Path, required=True, help="loso.py's <work>/folds")
    p.add_argument("--sources", required=True, help="comma-separated held-out sources")
    p.add_argument("--scales", default="0,0.2,0.4,0.6,0.8,1.0")
    args = p.parse_args()
    cache, rows = EmbeddingCache(), []
    for source in args.sources.split(","):
        data = load_beir(args.folds / source, list(SPLITS))
        model = medadapt.load(args.runs / f"moe-{source}", device="cpu")
        head = next(m for m in model.modules() if isinstance(m, MoEHead))

        def scores():
            return {s: round(evaluate_retrieval(model, data, s, ["ndcg@10"], cache=cache,
                                                show_progress=False)["ndcg@10"], 4) for s in SPLITS}

        chosen = dict(zip(head.config.domains, head.config.domain_scales))
        rows.append({"held-out source": source, "scale": f"routed ({', '.join(f'{d} {g:g}' for d, g in chosen.items())})",
                     **scores()})
        head.domain_routing = False
        for g in (float(x) for x in args.scales.split(",")):
            head.residual_scale = g
            rows.append({"held-out source": source, "scale": f"{g:g}", **scores()})
            print(rows[-1], flush=True)
    finish(args, rows, ["held-out source", "scale", *SPLITS])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
