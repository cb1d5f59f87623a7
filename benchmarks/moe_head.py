"""Med-MoE-Embed head vs single-expert heads vs the frozen backbone, one run, on MedQuAD.

    python benchmarks/moe_head.py --output benchmarks/results/moe_head.json --plot docs/img/moe_expert_load.png

Every head trains on cached all-MiniLM-L6-v2 embeddings of the train split (the corpus is encoded once,
through the medadapt cache) with mined hard negatives, and is evaluated on dev and test with the head
applied to the cached backbone embeddings (identical to encoding with the attached head). Columns:
nDCG@10 (dev, test), Recall@100 and MRR@10 (test), training seconds, head parameters, and the added
query-encode time of the attached head relative to the backbone alone (median of interleaved repeats).
``--full-finetune`` adds a 1-epoch MultipleNegativesRankingLoss fine-tune of the backbone (about an hour
of CPU plus a corpus re-encode). ``--mining-ablation`` adds the MoE head trained with in-batch negatives
only and with unguarded hard negatives (the Curation issue's check).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish  # noqa: E402

TEST_METRICS = ["ndcg@10", "recall@100", "mrr@10"]


def head_configs(dim: int, expansion: int):
    from medadapt.heads import MoEConfig

    return {
        "MLP-GELU head": MoEConfig.single_expert(dim, "mlp_gelu", expansion=expansion),
        "MLP-SwiGLU head": MoEConfig.single_expert(dim, "mlp_swiglu", expansion=expansion),
        "KAN head": MoEConfig.single_expert(dim, "kan", expansion=expansion),
        "MoE head (paper config)": MoEConfig.paper(dim, expansion=expansion),
        "MoE head, no residual/zero-init": MoEConfig.paper(dim, expansion=expansion, residual=False,
                                                            zero_init_output=False),
    }


def query_latency(model, queries: list[str], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        model.encode_query(queries, batch_size=64)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--dataset", default="medquad")
    p.add_argument("--model", default="minilm")
    p.add_argument("--expansion", type=int, default=4)
    p.add_argument("--epochs", type=int, default=1, help="learned-gating epochs")
    p.add_argument("--shared-epochs", type=int, default=2)
    p.add_argument("--random-epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--window", default="10,50", help="hard-negative rank window lo,hi")
    p.add_argument("--negatives", type=int, default=3)
    p.add_argument("--only", default=None, help="comma-separated subset of row names")
    p.add_argument("--full-finetune", action="store_true")
    p.add_argument("--mining-ablation", action="store_true")
    p.add_argument("--plot", type=Path, default=None, help="PNG of expert load of the MoE head")
    p.add_argument("--latency-queries", type=int, default=1000)
    args = p.parse_args()

    import numpy as np
    import torch

    from medadapt.cache import EmbeddingCache
    from medadapt.curation.mining_config import MiningConfig
    from medadapt.data import load_beir
    from medadapt.eval import dense_run, evaluate_run
    from medadapt.heads import MoEHead, attach
    from medadapt.models import load
    from medadapt.training.head_trainer import HeadTrainConfig, encode_with_head, train_head
    from medadapt.training.pairs import prepare_head_training

    torch.manual_seed(0)
    model = load(args.model, device="cpu")
    cache = EmbeddingCache()
    data = load_beir(args.data_dir / args.dataset, ["train", "dev", "test"])
    lo, hi = (int(x) for x in args.window.split(","))
    guarded = MiningConfig(window=(lo, hi), num_negatives=args.negatives, seed=42)
    prepared = prepare_head_training(model, data, "train", cache, mining=guarded)
    d_raw = torch.from_numpy(prepared.doc_raw)
    split_q = {}
    for split in ("dev", "test"):
        qs = data.split_queries(split)
        split_q[split] = (list(qs), torch.from_numpy(cache.encode(model, list(qs.values()), role="query",
                                                                   normalize=False, desc=f"{split} queries")))

    def evaluate(head) -> dict:
        docs = encode_with_head(head, d_raw).numpy() if head is not None else \
            torch.nn.functional.normalize(d_raw, dim=-1).numpy()
        out = {}
        for split, (qids, q_raw) in split_q.items():
            q = encode_with_head(head, q_raw).numpy() if head is not None else \
                torch.nn.functional.normalize(q_raw, dim=-1).numpy()
            run = dense_run(qids, q, data.doc_ids, docs, 100)
            res = evaluate_run(data.qrels[split], run, TEST_METRICS)
            if split == "dev":
                out["dev ndcg@10"] = res["ndcg@10"]
            else:
                out.update({f"test {k}": v for k, v in res.items()})
        return out

    latency_q = list(data.split_queries("test").values())[: args.latency_queries]
    base_latency = query_latency(model, latency_q)
    rows = [{"method": f"frozen {args.model}", **evaluate(None), "train s": 0.0, "params": 0,
             "+query time": "0%"}]
    base_cfg = dict(epochs=args.epochs, shared_epochs=args.shared_epochs, random_routing_epochs=args.random_epochs,
                    batch_size=args.batch_size, lr=args.lr, weight_decay=0.01, warmup_ratio=0.05, seed=42)
    dim = prepared.query_raw.shape[1]
    runs = dict(head_configs(dim, args.expansion))
    variants = {name: (cfg, prepared) for name, cfg in runs.items()}
    if args.mining_ablation:
        from medadapt.training.pairs import HeadTrainingData

        moe = runs["MoE head (paper config)"]
        inbatch = HeadTrainingData(prepared.pairs, prepared.query_raw, prepared.doc_raw, None)
        unguarded_cfg = MiningConfig(window=(lo, hi), num_negatives=args.negatives, seed=42,
                                     embedding_dup_threshold=None, text_dup_threshold=None)
        unguarded = prepare_head_training(model, data, "train", cache, mining=unguarded_cfg, show_progress=False)
        variants["MoE, in-batch negatives only"] = (moe, inbatch)
        variants["MoE, hard negatives without guard"] = (moe, unguarded)
    if args.only:
        keep = set(args.only.split(","))
        variants = {k: v for k, v in variants.items() if k in keep}
    moe_stats = None
    for name, (cfg, prep) in variants.items():
        torch.manual_seed(0)
        head = MoEHead(cfg)
        q, pos, neg = prep.tensors()
        result = train_head(head, q, pos, neg, HeadTrainConfig(**base_cfg))
        row = {"method": name, **evaluate(head), "train s": round(result.seconds, 1),
               "params": sum(x.numel() for x in head.parameters())}
        with_head = load(args.model, device="cpu")
        attach(with_head, head)
        lat = statistics.median([query_latency(with_head, latency_q, 1) / query_latency(model, latency_q, 1)
                                 for _ in range(3)])
        row["+query time"] = f"{100 * (lat - 1):+.1f}%"
        rows.append(row)
        print(row, flush=True)
        if name == "MoE head (paper config)":
            moe_stats = result.routing_stats
    if args.full_finetune:
        rows.append(full_finetune_row(args, model, data, cache))
    if args.plot and moe_stats:
        from medadapt.eval.report import plot_results

        plot_results({"expert load (learned stage)": dict(zip(moe_stats["names"], moe_stats["running_load"]))},
                     args.plot, title="Med-MoE-Embed: share of routed inputs per expert")
    columns = ["method", "dev ndcg@10", *[f"test {m}" for m in TEST_METRICS], "train s", "params", "+query time"]
    finish(args, rows, columns, {"base_query_seconds_per_1000": base_latency, "moe_routing": moe_stats,
                                 "config": vars(args) | {"data_dir": str(args.data_dir), "output": str(args.output),
                                                         "plot": str(args.plot)}})
    return 0


def full_finetune_row(args, model, data, cache) -> dict:
    """1 epoch of MultipleNegativesRankingLoss on the backbone (slow path of the recipe runner)."""
    import tempfile

    from medadapt.recipes import recipe_from_dict
    from medadapt.training import run_recipe

    recipe = recipe_from_dict({
        "name": "full-finetune", "model": {"backbone": args.model, "freeze_backbone": False},
        "data": {"path": str(args.data_dir / args.dataset)}, "head": {"kind": "none"},
        "training": {"epochs": 1, "batch_size": 64, "lr": 2e-5, "warmup_ratio": 0.1},
        "eval": {"split": "test", "metrics": TEST_METRICS},
    })
    with tempfile.TemporaryDirectory() as out:
        res = run_recipe(recipe, out, cache=cache)
    return {"method": "full fine-tune (1 epoch MNRL)", **{f"test {k}": v for k, v in res.metrics.items()},
            "train s": round(res.train_seconds, 1), "params": sum(p.numel() for p in model.parameters()),
            "+query time": "0%"}


if __name__ == "__main__":
    sys.exit(main())
