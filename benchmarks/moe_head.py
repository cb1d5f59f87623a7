"""Med-MoE-Embed head vs single-expert heads vs the frozen backbone, one run, on MedQuAD.

    python benchmarks/moe_head.py --output benchmarks/results/moe_head.json --plot docs/img/moe_expert_load.png

Every head trains on cached all-MiniLM-L6-v2 embeddings of the train split (the corpus is encoded once,
through the medadapt cache) with mined hard negatives, and is evaluated on dev and test with the head
applied to the cached backbone embeddings (identical to encoding with the attached head). Columns:
nDCG@10 (dev, test), Recall@100 and MRR@10 (test), training seconds, head parameters, and the added
query-encode time of the attached head relative to the backbone alone: the head's own best-of-5 time on
encode-sized batches over the backbone's best-of-3 ``encode_query`` time for the same 1,000 test queries.
The first MoE row is the shipped recipe's head (MLP experts, γ = 0.6). The other heads serve ``v + γ·h``
with ``γ = --residual-scale`` (WiSE-FT interpolation, default 0.45), except the row marked γ=1. The ``unseen`` column evaluates on a query set no head trained on (builtin medmini).
``--full-finetune`` adds a 1-epoch MultipleNegativesRankingLoss fine-tune of the backbone (about an hour
of CPU plus a corpus re-encode). ``--mining-ablation`` adds the MoE head trained with in-batch negatives
only and with unguarded hard negatives (the Curation issue's check).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish  # noqa: E402

TEST_METRICS = ["ndcg@10", "recall@100", "mrr@10"]


def head_configs(dim: int, expansion: int, grid: int, scale: float):
    from medadapt.moe import MoEConfig

    kan = {"grid_size": grid}
    return {
        "MLP-GELU head": MoEConfig.single_expert(dim, "mlp_gelu", expansion=expansion, residual_scale=scale),
        "MLP-SwiGLU head": MoEConfig.single_expert(dim, "mlp_swiglu", expansion=expansion, residual_scale=scale),
        "KAN head": MoEConfig.single_expert(dim, "kan", expansion=expansion, residual_scale=scale,
                                            expert_options={"kan": kan}),
        "MoE head (paper config)": MoEConfig.paper(dim, expansion=expansion, residual_scale=scale,
                                                   expert_options={"kan": kan, "mlp_kan": kan}),
        "MoE head, no interpolation (γ=1)": MoEConfig.paper(dim, expansion=expansion,
                                                            expert_options={"kan": kan, "mlp_kan": kan}),
        "MoE head, no residual/zero-init": MoEConfig.paper(dim, expansion=expansion, residual=False,
                                                            zero_init_output=False,
                                                            expert_options={"kan": kan, "mlp_kan": kan}),
    }


def query_latency(model, queries: list[str], repeats: int = 3) -> float:
    """Best-of-``repeats`` seconds to encode ``queries`` (the minimum is the least noisy on a shared CPU)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        model.encode_query(queries, batch_size=64)
        times.append(time.perf_counter() - t)
    return min(times)


def head_latency(head, dim: int, n: int, batch_size: int = 64, repeats: int = 5) -> float:
    """Best-of-``repeats`` seconds for the head alone on ``n`` embeddings, in encode-sized batches."""
    import torch

    x = torch.randn(n, dim) * 6
    head.eval()
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            t = time.perf_counter()
            for i in range(0, n, batch_size):
                head({"sentence_embedding": x[i : i + batch_size]})
            times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--dataset", default="medquad")
    p.add_argument("--model", default="minilm")
    p.add_argument("--expansion", type=int, default=2)
    p.add_argument("--kan-grid", type=int, default=3)
    p.add_argument("--residual-scale", type=float, default=0.45, help="WiSE-FT interpolation γ at inference")
    p.add_argument("--unseen", default="medmini", help="held-out query set (BEIR folder or builtin name)")
    p.add_argument("--epochs", type=int, default=1, help="learned-gating epochs")
    p.add_argument("--shared-epochs", type=int, default=2)
    p.add_argument("--random-epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--window", default="3,30", help="hard-negative rank window lo,hi")
    p.add_argument("--negatives", type=int, default=7)
    p.add_argument("--only", default=None, help="comma-separated subset of row names")
    p.add_argument("--full-finetune", action="store_true")
    p.add_argument("--mining-ablation", action="store_true")
    p.add_argument("--plot", type=Path, default=None, help="PNG of expert load of the MoE head")
    p.add_argument("--latency-queries", type=int, default=1000)
    args = p.parse_args()

    import torch

    from medadapt.cache import EmbeddingCache
    from medadapt.curation.mining_config import MiningConfig
    from medadapt.data import load_beir
    from medadapt.eval import dense_run, evaluate_run
    from medadapt.models import load
    from medadapt.moe import MoEHead, MoETrainingSection, encode_with_head, train_head
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

    unseen = load_beir(args.unseen, "test")
    unseen_ids = list(unseen.split_queries("test"))
    unseen_q = torch.from_numpy(cache.encode(model, [unseen.queries[q] for q in unseen_ids], role="query",
                                             normalize=False, show_progress=False))
    unseen_d = torch.from_numpy(cache.encode(model, unseen.doc_texts(), role="document", normalize=False,
                                             show_progress=False))

    def apply(head, x):
        return encode_with_head(head, x).numpy() if head is not None else \
            torch.nn.functional.normalize(x, dim=-1).numpy()

    def evaluate(head) -> dict:
        docs = apply(head, d_raw)
        run = dense_run(unseen_ids, apply(head, unseen_q), unseen.doc_ids, apply(head, unseen_d), 100)
        out = {f"unseen ({args.unseen}) ndcg@10": evaluate_run(unseen.qrels["test"], run, ["ndcg@10"])["ndcg@10"]}
        for split, (qids, q_raw) in split_q.items():
            run = dense_run(qids, apply(head, q_raw), data.doc_ids, docs, 100)
            res = evaluate_run(data.qrels[split], run, TEST_METRICS)
            if split == "dev":
                out["dev ndcg@10"] = res["ndcg@10"]
            else:
                out.update({f"test {k}": v for k, v in res.items()})
        return out

    latency_q = list(data.split_queries("test").values())[: args.latency_queries]
    base_latency = query_latency(model, latency_q)
    print(f"backbone encode_query: {1000 * base_latency / len(latency_q):.2f} ms/query", flush=True)
    rows = [{"method": f"frozen {args.model}", **evaluate(None), "train s": 0.0, "params": 0,
             "+query time": "0%"}]
    base_cfg = dict(epochs=args.epochs, shared_epochs=args.shared_epochs, random_routing_epochs=args.random_epochs,
                    batch_size=args.batch_size, lr=args.lr, weight_decay=0.01, warmup_ratio=0.05, seed=42)
    dim = prepared.query_raw.shape[1]
    runs = dict(head_configs(dim, args.expansion, args.kan_grid, args.residual_scale))
    from medadapt.recipes import load_recipe

    shipped = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed.yaml")
    runs = {"MoE head, MLP experts (recipes/med-moe-embed.yaml)": shipped.head.to_config(dim), **runs}
    variants = {name: (cfg, prepared) for name, cfg in runs.items()}
    if args.mining_ablation:
        from medadapt.training.pairs import HeadTrainingData

        moe = runs["MoE head, MLP experts (recipes/med-moe-embed.yaml)"]
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
        result = train_head(head, q, pos, neg, MoETrainingSection(**base_cfg))
        row = {"method": name, **evaluate(head), "train s": round(result.seconds, 1),
               "params": sum(x.numel() for x in head.parameters())}
        row["+query time"] = f"{100 * head_latency(head, dim, len(latency_q)) / base_latency:+.1f}%"
        rows.append(row)
        print(row, flush=True)
        if name.startswith("MoE head, MLP experts"):
            moe_stats = result.routing_stats
    if args.full_finetune:
        rows.append(full_finetune_row(args, model, data, cache))
    if args.plot and moe_stats:
        from medadapt.eval.report import plot_results

        load = {f"{i}: {n}": v for i, (n, v) in enumerate(zip(moe_stats["names"], moe_stats["running_load"]))}
        plot_results({"expert load (learned stage)": load}, args.plot,
                     title="Med-MoE-Embed: share of routed inputs per expert")
    columns = ["method", "dev ndcg@10", *[f"test {m}" for m in TEST_METRICS], f"unseen ({args.unseen}) ndcg@10",
               "train s", "params", "+query time"]
    finish(args, rows, columns, {"base_query_seconds_per_1000": base_latency, "moe_routing": moe_stats,
                                 "config": vars(args) | {"data_dir": str(args.data_dir), "output": str(args.output),
                                                         "plot": str(args.plot)}})
    return 0


def full_finetune_row(args, model, data, cache) -> dict:
    """1 epoch of MultipleNegativesRankingLoss on the backbone (slow path of the ``moe`` recipe)."""
    import tempfile

    from medadapt.recipes import load_recipe, run_recipe

    recipe = load_recipe({
        "kind": "moe", "name": "full-finetune", "model": {"backbone": args.model, "freeze_backbone": False},
        "data": {"path": str(args.data_dir / args.dataset)}, "head": {"kind": "none"},
        "training": {"epochs": 1, "batch_size": 64, "lr": 2e-5, "warmup_ratio": 0.1},
        "eval": {"split": "test", "metrics": TEST_METRICS},
    })
    with tempfile.TemporaryDirectory() as tmp:  # model folder and its checkpoints (beside it) both inside
        res = run_recipe(recipe, Path(tmp) / "model", cache=cache)
    return {"method": "full fine-tune (1 epoch MNRL)", **{f"test {k}": v for k, v in res.metrics.items()},
            "train s": round(res.train_seconds, 1), "params": sum(p.numel() for p in model.parameters()),
            "+query time": "0%"}


if __name__ == "__main__":
    sys.exit(main())
