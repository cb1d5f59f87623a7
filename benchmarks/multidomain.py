"""Ablation on dev for recipes/medical-multidomain-dense.yaml (issue 40): one head trained on MedQuAD + questiondoctors,
what each ingredient does on each domain's dev split.

    python benchmarks/multidomain.py --output benchmarks/results/multidomain_ablation.json

Variants (all on the frozen packaged all-MiniLM-L6-v2, trained on both train splits): the MoE head of
recipes/med-moe-embed.yaml trained on the mix without and with domain-balanced sampling, on both sides and on the
query route only (documents frozen: no re-encode), the linear query adapter on the same mix, and for each MoE
variant the residual scale gamma (v + gamma h, applied at inference: one trained head, several gammas) swept on
dev. Dev only: the test splits are read by benchmarks/peers.py with the recipe as chosen here.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETS = ("medquad", "questiondoctors")
GAMMAS = (0.2, 0.4, 0.6, 0.8, 1.0)


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/medadapt-multidomain"))
    p.add_argument("--only", default=None, help="semicolon-separated subset of variant names")
    args = p.parse_args()

    import yaml

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval.retrieval import evaluate_retrieval
    from medadapt.models import load
    from medadapt.recipes import load_recipe, run_recipe

    cache = EmbeddingCache()
    data = {s: load_beir(args.data_dir / s, ["dev"]) for s in SETS}

    def dev(model) -> dict:
        return {s: round(evaluate_retrieval(model, data[s], "dev", ["ndcg@10"], cache=cache,
                                            show_progress=False)["ndcg@10"], 4) for s in SETS}

    frozen = dev(load("minilm", device="cpu"))
    rows = [{"variant": "frozen all-MiniLM-L6-v2", **{f"{s} dev": v for s, v in frozen.items()}}]
    print(rows[0], flush=True)
    shipped = yaml.safe_load((ROOT / "recipes" / "med-moe-embed.yaml").read_text())
    moe = {"kind": "moe", "name": "ablation", "model": {"backbone": "minilm", "freeze_backbone": True},
           "data": {"path": str(args.data_dir / "medquad"), "mix": [{"path": str(args.data_dir / "questiondoctors")}],
                    "hard_negatives": shipped["data"]["hard_negatives"]},
           "head": shipped["head"], "loss": shipped["loss"], "training": shipped["training"],
           "eval": {"split": "dev", "metrics": ["ndcg@10"]}}
    linear = {**copy.deepcopy(moe), "head": {"kind": "linear", "route": "query"},
              "loss": {"kind": "infonce", "temperature": 0.05},
              "training": {"epochs": 20, "batch_size": 64, "lr": 3e-4, "weight_decay": 0.0, "seed": 0}}
    linear["data"].pop("hard_negatives")
    variants = {
        "MoE, mix": (moe, {}),
        "MoE, mix, balanced": (moe, {"data": {"balance": "domain"}}),
        "MoE, mix, balanced, query only": (moe, {"data": {"balance": "domain"}, "head": {"route": "query"}}),
        "MoE, mix, query only": (moe, {"head": {"route": "query"}}),
        "linear query adapter, mix, balanced": (linear, {"data": {"balance": "domain"}}),
    }
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only.split(";")}
    for name, (base, extra) in variants.items():
        spec = copy.deepcopy(base)
        for key, value in extra.items():
            spec[key] = {**spec[key], **value}
        t = time.perf_counter()
        res = run_recipe(load_recipe(spec), args.work / name.replace(" ", "_").replace(",", ""), cache=cache,
                         evaluate=False, overwrite=True, show_progress=False, log=lambda *_: None)
        seconds = round(time.perf_counter() - t, 1)
        heads = [m for m in res.model.modules() if hasattr(m, "residual_scale")]
        for gamma in GAMMAS if heads else (None,):
            for h in heads:
                h.residual_scale = gamma
            scores = dev(res.model)
            row = {"variant": name + (f", gamma {gamma}" if gamma is not None else ""),
                   **{f"{s} dev": v for s, v in scores.items()},
                   **{f"{s} delta": round(scores[s] - frozen[s], 4) for s in SETS},
                   "train s": res.train_seconds and round(res.train_seconds, 1), "run s": seconds,
                   "pairs": json.dumps(res.details.get("pairs_per_domain")),
                   "balanced pairs": res.details.get("balanced_pairs")}
            rows.append(row)
            print(row, flush=True)
    finish(args, rows, ["variant", *[f"{s} dev" for s in SETS], *[f"{s} delta" for s in SETS], "train s",
                        "balanced pairs"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
