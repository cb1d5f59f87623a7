"""Full and LoRA fine-tunes of a sentence-transformers model, the peer rows of benchmarks/peers.py.

    python benchmarks/peers_finetune.py --model DIR --data-dir ../shared/data --out DIR \\
        --train questiondoctors,medquad,both --methods full,lora --epochs 3

What a user would try first to adapt an embedder: sentence-transformers' ``MultipleNegativesRankingLoss``
(in-batch negatives, scale 20 = temperature 0.05) on the (query, relevant document) pairs of a data set's train
split, the whole backbone (``full``) or a PEFT LoRA on it (``lora``, r 16 on query/key/value/dense). After every
epoch the model re-encodes every evaluation corpus and writes the top-100 of the dev and test queries of every
evaluation set (epoch 0 = the frozen model); ``benchmarks/peers.py --finetune-results DIR`` scores those runs
with medadapt's metric code and picks the epoch on dev.

Why standalone (torch, numpy, sentence-transformers and peft only, its own BEIR reader and training loop): it
runs on a lent GPU machine whose image has those packages but not medadapt's other requirements. The loop is
the plain one the sentence-transformers docs show for MNRL (AdamW, linear warm-up and decay from
transformers), with one guard: a batch never holds two pairs of the same query or of the same document, so a
query's other relevant documents are never its in-batch negatives.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch


def read_beir(folder: Path, splits: tuple[str, ...] = ("train", "dev", "test")) -> dict:
    corpus = {}
    with open(folder / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            corpus[d["_id"]] = ((d.get("title") or "") + " " + d["text"]).strip()
    queries = {}
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            queries[d["_id"]] = d["text"]
    qrels = {}
    for split in splits:
        rel: dict[str, dict[str, int]] = {}
        path = folder / "qrels" / f"{split}.tsv"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            q, d, s = line.split("\t")
            if i == 0 and s == "score":
                continue
            if int(s) > 0:
                rel.setdefault(q, {})[d] = int(s)
        qrels[split] = rel
    return {"corpus": corpus, "queries": queries, "qrels": qrels}


def pairs(data: dict) -> list[tuple[str, str, str, str]]:
    return [(q, data["queries"][q], d, data["corpus"][d]) for q, rel in data["qrels"]["train"].items()
            for d in rel]


def batches(items: list, batch_size: int, rng: random.Random) -> list[list]:
    """Shuffled batches with no query id and no document id twice (a pair that clashes waits for the next)."""
    pool = items[:]
    rng.shuffle(pool)
    out, current, qs, ds, waiting = [], [], set(), set(), []
    for item in pool:
        waiting.append(item)
        kept = []
        for it in waiting:
            if it[0] in qs or it[2] in ds:
                kept.append(it)
                continue
            current.append(it)
            qs.add(it[0])
            ds.add(it[2])
            if len(current) == batch_size:
                out.append(current)
                current, qs, ds = [], set(), set()
        waiting = kept
    current += [w for w in waiting if w[0] not in qs and w[2] not in ds]
    if len(current) >= 2:
        out.append(current)
    return out


@torch.no_grad()
def top100(model, data: dict, splits: list[str], doc_ids: list[str], batch_size: int) -> dict:
    model.eval()
    docs = model.encode([data["corpus"][d] for d in doc_ids], batch_size=batch_size, convert_to_tensor=True,
                        normalize_embeddings=True, show_progress_bar=False)
    out = {}
    for split in splits:
        qids = sorted(data["qrels"][split])
        q = model.encode([data["queries"][x] for x in qids], batch_size=batch_size, convert_to_tensor=True,
                         normalize_embeddings=True, show_progress_bar=False)
        scores, idx = (q @ docs.T).topk(min(100, len(doc_ids)), dim=1)
        out[split] = {"qids": qids, "idx": idx.cpu().numpy().astype(np.uint16),
                      "scores": scores.float().cpu().numpy().astype(np.float32)}
    model.train()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="sentence-transformers model folder")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--train", default="questiondoctors,medquad,both",
                   help="comma list of data sets to train on; 'both' = medquad + questiondoctors together")
    p.add_argument("--eval-sets", default="medquad,questiondoctors")
    p.add_argument("--eval-splits", default="dev,test",
                   help="qrels splits to write top-100 for (the first one picks the epoch in peers.py / loso.py); "
                        "a leave-one-source-out fold of benchmarks/loso.py: dev,test-in,test-out")
    p.add_argument("--methods", default="full,lora")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr-full", type=float, default=2e-5)
    p.add_argument("--lr-lora", type=float, default=2e-4)
    p.add_argument("--max-seq-length", type=int, default=256)
    p.add_argument("--bf16", action="store_true", help="train under bf16 autocast (encoding stays float32)")
    p.add_argument("--limit", type=int, default=None, help="smoke test: first N training pairs only")
    p.add_argument("--budget-s", type=float, default=1e9, help="stop starting new runs after this many seconds")
    args = p.parse_args()

    from peft import LoraConfig, get_peft_model
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from transformers import get_linear_schedule_with_warmup

    t_start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    eval_splits = args.eval_splits.split(",")
    sets = {name: read_beir(args.data_dir / name, ("train", *eval_splits)) for name in args.eval_sets.split(",")}
    doc_ids = {name: sorted(d["corpus"]) for name, d in sets.items()}
    meta = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
            "args": {k: str(v) for k, v in vars(args).items()}, "doc_ids": doc_ids, "runs": {}}

    def evaluate(model) -> dict:
        return {name: top100(model, data, eval_splits, doc_ids[name], 256) for name, data in sets.items()}

    def save(tag: str, per_epoch: list[dict]) -> None:
        arrays = {}
        for epoch, ev in enumerate(per_epoch):
            for name, splits in ev.items():
                for split, r in splits.items():
                    key = f"{name}.{split}.{epoch}"
                    arrays[key + ".idx"], arrays[key + ".scores"] = r["idx"], r["scores"]
                    meta.setdefault("qids", {})[f"{name}.{split}"] = r["qids"]
        np.savez_compressed(args.out / f"{tag}.npz", **arrays)
        (args.out / "meta.json").write_text(json.dumps(meta))

    frozen = SentenceTransformer(args.model, device=device)
    frozen.max_seq_length = args.max_seq_length
    t = time.perf_counter()
    save("frozen", [evaluate(frozen)])
    meta["runs"]["frozen"] = {"eval_seconds": time.perf_counter() - t}
    print(f"frozen evaluated in {time.perf_counter() - t:.1f}s", flush=True)
    del frozen

    for train in args.train.split(","):
        for method in args.methods.split(","):
            tag = f"{method}-{train}"
            if time.perf_counter() - t_start > args.budget_s:
                print(f"skip {tag}: budget spent", flush=True)
                continue
            torch.manual_seed(0)
            rng = random.Random(0)
            names = ["medquad", "questiondoctors"] if train == "both" else [train]
            items = []
            for name in names:
                data = sets.get(name) or read_beir(args.data_dir / name)
                items += [(f"{name}:{q}", qt, f"{name}:{d}", dt) for q, qt, d, dt in pairs(data)]
            items = items[: args.limit] if args.limit else items
            model = SentenceTransformer(args.model, device=device)
            model.max_seq_length = args.max_seq_length
            if method == "lora":
                cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.1,
                                 target_modules=["query", "key", "value", "dense"])
                model[0].auto_model = get_peft_model(model[0].auto_model, cfg)
            loss_fn = MultipleNegativesRankingLoss(model, scale=20.0)
            params = [x for x in model.parameters() if x.requires_grad]
            lr = args.lr_lora if method == "lora" else args.lr_full
            opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
            steps = args.epochs * (len(items) // args.batch_size + 1)
            sched = get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
            per_epoch, train_s = [], 0.0
            for epoch in range(args.epochs):
                t = time.perf_counter()
                model.train()
                for batch in batches(items, args.batch_size, rng):
                    q = model.tokenize([b[1] for b in batch])
                    d = model.tokenize([b[3] for b in batch])
                    q = {k: v.to(device) if torch.is_tensor(v) else v for k, v in q.items()}
                    d = {k: v.to(device) if torch.is_tensor(v) else v for k, v in d.items()}
                    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=args.bf16):
                        loss = loss_fn([q, d], None)
                    if not torch.isfinite(loss):
                        raise SystemExit(f"{tag}: non-finite loss at epoch {epoch}")
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
                train_s += time.perf_counter() - t
                per_epoch.append(evaluate(model))
                print(f"{tag} epoch {epoch + 1}: loss {loss.item():.4f}, {train_s:.1f}s training so far", flush=True)
            trainable = sum(x.numel() for x in params)
            meta["runs"][tag] = {"train_seconds": train_s, "pairs": len(items), "trainable_params": trainable,
                                 "epochs": args.epochs, "lr": lr,
                                 "saved_bytes_fp32": 4 * trainable}
            # epoch e of this run is key .{e-1}: epoch 0 (frozen) lives in frozen.npz
            save(tag, per_epoch)
            del model, opt
            if device == "cuda":
                torch.cuda.empty_cache()
    meta["total_seconds"] = time.perf_counter() - t_start
    (args.out / "meta.json").write_text(json.dumps(meta))
    print(f"done in {meta['total_seconds']:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
