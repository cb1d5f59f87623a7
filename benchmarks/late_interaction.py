"""Late interaction (ColBERT-style MaxSim) over frozen all-MiniLM-L6-v2 token embeddings, on real patients'
questions (questiondoctors) and on templated ones (medquad-mini) (issue 40): does scoring every query token against
every document token, frozen or with a trained projection, reach the +0.05 nDCG@10 that no pooled head reached?

    python benchmarks/late_interaction.py --cache-dir /work/scratch/late_cache \\
        --output benchmarks/results/late_interaction.json

Rows, on each set (every setting chosen on that set's dev split, then scored once on test with a paired bootstrap
CI against frozen dense):
1. frozen dense: the pooled (mean, normalised) embedding;
2. frozen MaxSim: the same model's token embeddings (``output_value="token_embeddings"``), each token L2-normalised,
   score = mean (or sum) over query tokens of the max cosine over document tokens; [CLS]/[SEP] kept or dropped;
3. dense + MaxSim fusion: per-query z-score or min-max normalised full score vectors, MaxSim weight chosen on dev;
4. a trained late-interaction head: one linear map on the frozen token embeddings (384 -> 128 initialised from
   the corpus tokens' principal directions, or 384 -> 384 identity-initialised), shared by queries and documents,
   trained with InfoNCE over MaxSim scores (in-batch negatives, temperature 0.05, optionally one hard negative per
   pair mined from the frozen dense ranking, ranks 3-30) on ``--train-set``'s train split; shape x lr chosen on its
   dev split with in-batch negatives, then the best of them also with hard negatives, the epoch kept at its dev
   best; then the chosen setting trained on the train splits of every set together;
5. dense + trained MaxSim fusion (the weight chosen on dev).

MaxSim rows rerank each query's frozen dense top ``--depth`` documents (``--depth 0``: the whole corpus, about
eight times the CPU time); fusion normalises both scores over those documents. Token embeddings are encoded once
per set and cached as float16 under ``--cache-dir``; training reads them only (the backbone stays frozen).
Storage per document is for float16 vectors.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from _common import base_parser, finish

from medadapt.cache import EmbeddingCache
from medadapt.data import load_beir
from medadapt.eval import evaluate_run
from medadapt.eval.compare import paired_comparison, per_query_scores
from medadapt.eval.retrieval import encode_split
from medadapt.models import load

METRICS = ["ndcg@10", "mrr@10", "recall@100"]
FUSION_WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: (output dim, initialisation) of the trained head
HEAD_SHAPES = ((128, "pca"), (384, "identity"))


class Tokens:
    """Frozen token embeddings of a list of texts: one float16 array of all tokens plus offsets."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat, self.offsets = flat, offsets

    def get(self, i: int, special: bool) -> np.ndarray:
        a, b = self.offsets[i], self.offsets[i + 1]
        if not special and b - a > 2:
            a, b = a + 1, b - 1  # drop [CLS] and [SEP]
        return self.flat[a:b]

    def lengths(self, special: bool) -> np.ndarray:
        n = np.diff(self.offsets)
        return n if special else np.where(n > 2, n - 2, n)


def token_cache(model, texts: list[str], path: Path) -> tuple[Tokens, float]:
    """Load or encode (and save) the token embeddings of ``texts``; returns them and the encoding seconds."""
    key = hashlib.sha1("\x00".join(texts).encode()).hexdigest()[:12]
    file = path.with_name(f"{path.name}-{key}.npz")
    if file.exists():
        z = np.load(file)
        return Tokens(z["flat"], z["offsets"]), float(z["seconds"])
    start = time.perf_counter()
    out = model.encode(texts, output_value="token_embeddings", batch_size=64, show_progress_bar=False,
                       convert_to_numpy=False)
    seconds = time.perf_counter() - start
    arrays = [t.float().cpu().numpy().astype(np.float16) for t in out]
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int64)
    file.parent.mkdir(parents=True, exist_ok=True)
    np.savez(file, flat=np.concatenate(arrays), offsets=offsets, seconds=seconds)
    return Tokens(np.concatenate(arrays), offsets), seconds


def pad(arrays: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack variable-length token arrays into ``[n, L, d]`` float32 plus a boolean ``[n, L]`` mask."""
    n, length, dim = len(arrays), max(len(a) for a in arrays), arrays[0].shape[1]
    x, mask = torch.zeros(n, length, dim), torch.zeros(n, length, dtype=torch.bool)
    for i, a in enumerate(arrays):
        x[i, : len(a)] = torch.from_numpy(a.astype(np.float32))
        mask[i, : len(a)] = True
    return x, mask


def embed(x: torch.Tensor, proj: torch.nn.Linear | None) -> torch.Tensor:
    return torch.nn.functional.normalize(proj(x) if proj is not None else x, dim=-1)


@torch.no_grad()
def maxsim_matrix(queries: list[np.ndarray], docs: Tokens, special: bool, proj=None,
                  chunk_tokens: int = 12_000, query_tokens: int = 1_500) -> np.ndarray:
    """Full ``[n_queries, n_docs]`` MaxSim matrix (mean over query tokens of the max cosine over document tokens)."""
    qf = embed(torch.from_numpy(np.concatenate(queries).astype(np.float32)), proj)
    qlen = np.array([len(q) for q in queries])
    qstart = np.concatenate([[0], np.cumsum(qlen)])
    owner = torch.from_numpy(np.repeat(np.arange(len(queries)), qlen))
    # query groups of whole queries, ~query_tokens tokens each
    groups, first = [], 0
    for i in range(1, len(queries) + 1):
        if i == len(queries) or qstart[i + 1] - qstart[first] > query_tokens:
            groups.append((first, i))
            first = i
    lengths = docs.lengths(special)
    order = np.argsort(lengths, kind="stable")  # chunks of similar length pad little
    chunks, first = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or (i + 1 - first) * lengths[order[i]] > chunk_tokens:
            chunks.append(order[first:i])
            first = i
    scores = np.zeros((len(queries), len(lengths)), np.float32)
    for idx in chunks:
        d, mask = pad([docs.get(int(j), special) for j in idx])
        d = embed(d, proj)
        n, length, dim = d.shape
        flat_d = d.reshape(n * length, dim).T
        for a, b in groups:
            sims = (qf[qstart[a]:qstart[b]] @ flat_d).view(-1, n, length)
            best = sims.masked_fill(~mask[None], float("-inf")).amax(-1)  # [tokens, n]
            per_query = torch.zeros(b - a, n).index_add_(0, owner[qstart[a]:qstart[b]] - a, best)
            scores[a:b, idx] = (per_query / torch.from_numpy(qlen[a:b, None]).float()).numpy()
    return scores


@torch.no_grad()
def maxsim_rerank(queries: list[np.ndarray], docs: Tokens, special: bool, proj, candidates: list[np.ndarray],
                  n_docs: int) -> np.ndarray:
    """MaxSim of each query against its own candidate documents only; every other document scores -1e4."""
    lengths = docs.lengths(special)
    starts = docs.offsets[:-1] + (0 if special else (np.diff(docs.offsets) > 2))
    de = embed(torch.from_numpy(docs.flat.astype(np.float32)), proj)
    scores = np.full((len(queries), n_docs), -1e4, np.float32)
    for i, (q, cand) in enumerate(zip(queries, candidates)):
        ranges = [np.arange(starts[j], starts[j] + lengths[j]) for j in cand]
        tok = torch.from_numpy(np.concatenate(ranges))
        width = int(lengths[cand].max())
        index = torch.full((len(cand), width), len(tok), dtype=torch.long)
        pos = 0
        for r, n in enumerate(lengths[cand]):
            index[r, :n] = torch.arange(pos, pos + n)
            pos += n
        qe = embed(torch.from_numpy(q.astype(np.float32)), proj)
        sims = torch.cat([qe @ de[tok].T, torch.full((len(qe), 1), float("-inf"))], 1)
        scores[i, cand] = sims[:, index].amax(-1).mean(0).numpy()
    return scores


def run_from(qids: list[str], dids: list[str], scores: np.ndarray, k: int = 100) -> dict:
    top = np.argpartition(-scores, k, axis=1)[:, :k]
    return {q: {dids[j]: float(scores[i, j]) for j in top[i]} for i, q in enumerate(qids)}


def zscore(s: np.ndarray) -> np.ndarray:
    return (s - np.nanmean(s, 1, keepdims=True)) / (np.nanstd(s, 1, keepdims=True) + 1e-9)


def minmax(s: np.ndarray) -> np.ndarray:
    lo, hi = np.nanmin(s, 1, keepdims=True), np.nanmax(s, 1, keepdims=True)
    return (s - lo) / (hi - lo + 1e-9)


def fuse(dense: np.ndarray, late: np.ndarray, method: str, w: float) -> np.ndarray:
    """(1 - w) * dense + w * late, each normalised per query over the documents the late scores cover."""
    norm = zscore if method == "zscore" else minmax
    covered = late > -1e3
    out = (1 - w) * norm(np.where(covered, dense, np.nan)) + w * norm(np.where(covered, late, np.nan))
    return np.where(covered, out, -1e4).astype(np.float32)


class SetData:
    """One BEIR set: frozen dense scores, frozen token embeddings, qrels, ids."""

    def __init__(self, name: str, data, model, cache: EmbeddingCache, cache_dir: Path, depth: int):
        self.name, self.data = name, data
        self.dids = list(data.doc_ids)
        self.qids = {s: list(data.split_queries(s)) for s in ("train", "dev", "test")}
        qtexts = list(data.queries.values())
        self.qpos = {q: i for i, q in enumerate(data.queries)}
        self.docs, self.doc_seconds = token_cache(model, data.doc_texts(), cache_dir / f"{name}-docs")
        self.queries, _ = token_cache(model, qtexts, cache_dir / f"{name}-queries")
        self.dense, self.candidates = {}, None
        for s in ("train", "dev", "test"):
            qids, q, dids, d = encode_split(model, data, s, cache, show_progress=False)
            assert list(qids) == self.qids[s] and list(dids) == self.dids
            q, d = q / np.linalg.norm(q, axis=1, keepdims=True), d / np.linalg.norm(d, axis=1, keepdims=True)
            self.dense[s] = (q @ d.T).astype(np.float32)
        if depth:  # late scores rerank the frozen dense top ``depth`` of each query
            self.candidates = {s: np.argsort(-self.dense[s], axis=1)[:, :depth] for s in ("dev", "test")}

    def qtok(self, split: str, special: bool) -> list[np.ndarray]:
        return [self.queries.get(self.qpos[q], special) for q in self.qids[split]]

    def maxsim(self, split: str, special: bool, proj=None) -> np.ndarray:
        if self.candidates is None:
            return maxsim_matrix(self.qtok(split, special), self.docs, special, proj)
        return maxsim_rerank(self.qtok(split, special), self.docs, special, proj, list(self.candidates[split]),
                             len(self.dids))

    def metrics(self, split: str, scores: np.ndarray) -> tuple[dict, dict]:
        run = run_from(self.qids[split], self.dids, scores)
        res = evaluate_run(self.data.qrels[split], run, METRICS)
        return res, per_query_scores(self.data.qrels[split], run, "ndcg@10")

    def ndcg(self, split: str, scores: np.ndarray) -> float:
        return self.metrics(split, scores)[0]["ndcg@10"]

    def train_examples(self, special: bool) -> list[tuple]:
        """(query tokens, positive doc index, hard-negative pool, positive doc indices) per relevant pair."""
        dpos = {d: j for j, d in enumerate(self.dids)}
        qrels = self.data.qrels["train"]
        out = []
        for i, q in enumerate(self.qids["train"]):
            pos = {dpos[d] for d, g in qrels.get(q, {}).items() if g > 0 and d in dpos}
            ranked = np.argsort(-self.dense["train"][i])[2:30]  # frozen dense ranks 3-30
            pool = [int(j) for j in ranked if j not in pos]
            qt = self.queries.get(self.qpos[q], special)
            out += [(qt, j, pool, pos, self.name) for j in sorted(pos)]
        return out


def make_head(dim: int, init: str, docs: Tokens, seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    in_dim = docs.flat.shape[1]
    head = torch.nn.Linear(in_dim, dim, bias=False)
    with torch.no_grad():
        if init == "identity":
            head.weight.copy_(torch.eye(dim, in_dim))
        elif init == "pca":
            rng = np.random.default_rng(seed)
            x = torch.from_numpy(docs.flat[rng.choice(len(docs.flat), min(20_000, len(docs.flat)),
                                                      replace=False)].astype(np.float32))
            x = x - x.mean(0)
            _, vectors = torch.linalg.eigh(x.T @ x)  # ascending eigenvalues
            head.weight.copy_(vectors[:, -dim:].flip(1).T)
    return head


def batch_scores(queries: list[np.ndarray], docs: list[np.ndarray], head) -> torch.Tensor:
    """``[n_queries, n_docs]`` MaxSim scores with gradients: one matmul over all tokens, then a gather per document
    (padded pairs of queries and documents would cost about ten times more)."""
    qlen = torch.tensor([len(q) for q in queries])
    owner = torch.repeat_interleave(torch.arange(len(queries)), qlen)
    qe = embed(torch.from_numpy(np.concatenate(queries).astype(np.float32)), head)
    de = embed(torch.from_numpy(np.concatenate(docs).astype(np.float32)), head)
    dlen = [len(d) for d in docs]
    width, total = max(dlen), sum(dlen)
    index = torch.full((len(docs), width), total, dtype=torch.long)  # pads point at a -inf column
    start = 0
    for i, n in enumerate(dlen):
        index[i, :n] = torch.arange(start, start + n)
        start += n
    sims = torch.cat([qe @ de.T, torch.full((len(qe), 1), float("-inf"))], 1)
    best = sims[:, index].amax(-1)  # [query tokens, docs]
    return torch.zeros(len(queries), len(docs)).index_add(0, owner, best) / qlen[:, None]


def train_epoch(head, opt, examples, docs_by_set: dict, special: bool, hard: bool, batch: int, temp: float,
                rng: random.Random) -> None:
    order = list(range(len(examples)))
    rng.shuffle(order)
    for start in range(0, len(order), batch):
        ex = [examples[i] for i in order[start:start + batch]]
        if len(ex) < 2:
            continue
        doc_keys = [(e[4], e[1]) for e in ex]
        if hard:
            doc_keys += [(e[4], rng.choice(e[2])) for e in ex if e[2]]
        scores = batch_scores([e[0] for e in ex], [docs_by_set[s].get(j, special) for s, j in doc_keys], head)
        # other positives of the same query are not negatives
        false_neg = torch.tensor([[k != i and s == e[4] and j in e[3] for k, (s, j) in enumerate(doc_keys)]
                                  for i, e in enumerate(ex)])
        loss = torch.nn.functional.cross_entropy((scores / temp).masked_fill(false_neg, float("-inf")),
                                                 torch.arange(len(ex)))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {loss.item()}")
        opt.zero_grad()
        loss.backward()
        opt.step()


def train_head(train_sets: list[SetData], dev_set: SetData | None, shape, lr: float, hard: bool, epochs: int,
               special: bool, args) -> tuple[torch.nn.Linear, dict, float]:
    """Train one head; with ``dev_set`` score dev after each epoch and keep the best epoch's weights.

    Returns the head, ``{epoch: dev nDCG@10}`` and the training seconds up to the kept epoch (dev scoring excluded).
    """
    dim, init = shape
    head = make_head(dim, init, train_sets[0].docs, args.seed)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    examples = [e for s in train_sets for e in s.train_examples(special)]
    docs_by_set = {s.name: s.docs for s in train_sets}
    rng = random.Random(args.seed)
    curve, best, best_state, seconds, best_seconds = {}, -1.0, None, 0.0, 0.0
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        train_epoch(head, opt, examples, docs_by_set, special, hard, args.batch_size, args.temperature, rng)
        seconds += time.perf_counter() - start
        if dev_set is None:
            best_seconds = seconds
            continue
        curve[epoch] = round(dev_set.ndcg("dev", dev_set.maxsim("dev", special, head)), 4)
        print(f"  head {shape} lr={lr} hard={hard} epoch {epoch}: dev nDCG@10 {curve[epoch]} "
              f"({seconds:.0f} s of training)", flush=True)
        if curve[epoch] > best:
            best, best_seconds = curve[epoch], seconds
            best_state = {k: v.clone() for k, v in head.state_dict().items()}
    if best_state is not None:
        head.load_state_dict(best_state)
    return head, curve, best_seconds


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--sets", default="questiondoctors,medquad-mini")
    p.add_argument("--train-set", default="questiondoctors", help="the set whose dev split chooses the head")
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/medadapt-late-interaction"),
                   help="frozen token embeddings (float16 .npz) go here")
    p.add_argument("--epochs", type=int, default=3, help="most epochs; the best on dev is kept")
    p.add_argument("--lrs", default="1e-4,3e-4,1e-3", help="comma-separated learning rates tried on dev")
    p.add_argument("--depth", type=int, default=300,
                   help="MaxSim rows rerank each query's frozen dense top DEPTH documents (0: score the whole corpus)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=10_000)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    wall = time.perf_counter()

    def data_path(name: str) -> str:
        folder = args.data_dir / name
        return str(folder) if folder.exists() else name  # builtin sets (medquad-mini) by name

    model, cache = load("minilm", device="cpu"), EmbeddingCache()
    names = args.sets.split(",")
    sets = {}
    for name in names:
        start = time.perf_counter()
        sets[name] = SetData(name, load_beir(data_path(name), ["train", "dev", "test"]), model, cache,
                             args.cache_dir, args.depth)
        print(f"{name}: encoded/loaded in {time.perf_counter() - start:.0f} s", flush=True)

    rows, per_set = [], {}

    def add(s: SetData, method: str, setting: str, dev: np.ndarray, test: np.ndarray, **extra) -> None:
        dev_res, _ = s.metrics("dev", dev)
        test_res, pq = s.metrics("test", test)
        row = {"set": s.name, "method": method, "setting": setting,
               "dev ndcg@10": round(dev_res["ndcg@10"], 4), "dev mrr@10": round(dev_res["mrr@10"], 4),
               "test ndcg@10": round(test_res["ndcg@10"], 4), "test mrr@10": round(test_res["mrr@10"], 4),
               "test recall@100": round(test_res["recall@100"], 4)}
        if "base" in per_set.get(s.name, {}):
            c = paired_comparison(per_set[s.name]["base"], pq, n_resamples=args.resamples)
            row.update({"test delta": round(c.difference, 4), "95% CI": f"[{c.ci_low:+.4f}, {c.ci_high:+.4f}]"})
        else:
            per_set.setdefault(s.name, {})["base"] = pq
        row.update(extra)
        rows.append(row)
        print(row, flush=True)

    def fused(s, split, late, method, w):
        return fuse(s.dense[split], late, method, w)

    def best_fusion(s, late_dev):
        grid = {(m, w): s.ndcg("dev", fused(s, "dev", late_dev, m, w))
                for m, w in itertools.product(("zscore", "minmax"), FUSION_WEIGHTS)}
        return max(grid, key=grid.get), grid

    frozen_choice = {}
    for s in sets.values():
        dense_doc = s.docs.flat.shape[1] * 2
        add(s, "frozen dense (pooled)", "-", s.dense["dev"], s.dense["test"], **{
            "storage/doc": f"{dense_doc} B"})
        # frozen MaxSim: [CLS]/[SEP] kept or dropped; mean or sum over query tokens (a per-query constant factor)
        dev_scores, grid = {}, {}
        for special in (False, True):
            start = time.perf_counter()
            dev_scores[special] = s.maxsim("dev", special)
            print(f"{s.name} dev MaxSim special={special}: {time.perf_counter() - start:.0f} s", flush=True)
            qlen = np.array([len(q) for q in s.qtok("dev", special)], np.float32)[:, None]
            for agg in ("mean", "sum"):
                sc = dev_scores[special] * (qlen if agg == "sum" else 1.0)
                grid[(agg, "keep [CLS]/[SEP]" if special else "drop [CLS]/[SEP]")] = s.ndcg("dev", sc)
        agg, spec = max(grid, key=lambda k: (round(grid[k], 6), k[0] == "mean"))
        special = spec.startswith("keep")
        frozen_choice[s.name] = special
        start = time.perf_counter()
        test_late = s.maxsim("test", special)
        score_s = time.perf_counter() - start
        if agg == "sum":
            test_late = test_late * np.array([len(q) for q in s.qtok("test", special)], np.float32)[:, None]
        dev_late = dev_scores[special]
        tokens = float(s.docs.lengths(special).mean())
        add(s, "frozen MaxSim (token embeddings)", f"{agg} over query tokens, {spec}", dev_late, test_late,
            **{"storage/doc": f"{tokens * s.docs.flat.shape[1] * 2 / 1024:.1f} KB ({tokens:.0f} tokens)",
               "test scoring s": round(score_s, 1), "dev grid": {str(k): round(v, 4) for k, v in grid.items()}})
        (m, w), fgrid = best_fusion(s, dev_late)
        add(s, "dense + frozen MaxSim fusion", f"{m}, MaxSim weight {w}", fused(s, "dev", dev_late, m, w),
            fused(s, "test", test_late, m, w), **{"dev grid": {str(k): round(v, 4) for k, v in fgrid.items()}})
    print(f"frozen rows done at {time.perf_counter() - wall:.0f} s", flush=True)

    # trained late-interaction head: choose shape, lr, hard negatives and epoch on --train-set's dev split
    tr = sets[args.train_set]
    special = frozen_choice[tr.name]
    lrs = [float(x) for x in args.lrs.split(",")]
    grid, heads = {}, {}

    def fit(shape, lr, hard):
        head, curve, seconds = train_head([tr], tr, shape, lr, hard, args.epochs, special, args)
        best_epoch = max(curve, key=curve.get)
        grid[(shape, lr, hard)] = {"curve": curve, "best epoch": best_epoch, "train s": round(seconds, 1)}
        heads[(shape, lr, hard)] = head

    def best():
        return max(grid, key=lambda k: grid[k]["curve"][grid[k]["best epoch"]])

    # shape x lr with in-batch negatives, then the best of them with one mined hard negative per pair
    for shape, lr in itertools.product(HEAD_SHAPES, lrs):
        fit(shape, lr, False)
    fit(*best()[:2], True)
    choice = best()
    (dim, init), lr, hard = choice
    epochs = grid[choice]["best epoch"]
    setting = (f"{tr.docs.flat.shape[1]}->{dim} ({init} init), lr {lr}, {epochs} epoch(s), "
               f"{'one mined hard negative (dense ranks 3-30)' if hard else 'in-batch negatives only'}, "
               f"batch {args.batch_size}, temperature {args.temperature}")
    dev_grid = {f"{k[0][0]} {k[0][1]}, lr {k[1]}, hard {k[2]}": v for k, v in grid.items()}
    print(f"chosen head: {setting}", flush=True)

    trained = {f"trained on {tr.name}": (heads[choice], grid[choice]["train s"])}
    if len(sets) > 1:
        head, _, seconds = train_head(list(sets.values()), None, (dim, init), lr, hard, epochs, special, args)
        trained[f"trained on {' + '.join(sets)}"] = (head, round(seconds, 1))
    for label, (head, seconds) in trained.items():
        for s in sets.values():
            sp = frozen_choice[tr.name]
            dev_late = s.maxsim("dev", sp, head)
            start = time.perf_counter()
            test_late = s.maxsim("test", sp, head)
            score_s = time.perf_counter() - start
            tokens = float(s.docs.lengths(sp).mean())
            add(s, f"trained MaxSim head, {label}", setting, dev_late, test_late, **{
                "train s": seconds, "test scoring s": round(score_s, 1),
                "storage/doc": f"{tokens * dim * 2 / 1024:.1f} KB ({tokens:.0f} tokens)",
                **({"dev grid": dev_grid} if label == f"trained on {tr.name}" and s is tr else {})})
            (m, w), fgrid = best_fusion(s, dev_late)
            add(s, f"dense + trained MaxSim fusion, {label}", f"{m}, MaxSim weight {w}",
                fused(s, "dev", dev_late, m, w), fused(s, "test", test_late, m, w), **{"train s": seconds})
    rows.sort(key=lambda r: names.index(r["set"]))
    total = time.perf_counter() - wall
    print(f"total wall time {total:.0f} s")
    finish(args, rows, ["set", "method", "setting", "dev ndcg@10", "test ndcg@10", "test mrr@10", "test recall@100",
                        "test delta", "95% CI", "train s", "storage/doc"],
           {"sets": names, "train set": args.train_set, "wall seconds": round(total, 1),
            "encode seconds": {s.name: round(s.doc_seconds, 1) for s in sets.values()},
            "model": "sentence-transformers/all-MiniLM-L6-v2 (frozen)"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
