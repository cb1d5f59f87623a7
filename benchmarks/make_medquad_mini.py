"""Build the builtin ``medquad-mini`` set (``medadapt/data/builtin/medquad-mini/``) from the shared MedQuAD
BEIR folder, deterministically.

    python benchmarks/make_medquad_mini.py                      # ../shared/data/medquad -> the package folder
    python benchmarks/make_medquad_mini.py --source DIR --out DIR --seed 0

How it selects (the README it writes says the same):

* **Whole topic clusters.** A cluster is every answer whose title (MedQuAD's focus, compared case-blind)
  is the same, across MedQuAD's sources: the symptoms / treatment / outlook / genetics answers of one
  disease, and GARD's and GHR's answers on it, stay together, so every query keeps its hardest
  distractors in the corpus. Only clusters of at least two answers are taken (``--min-cluster``, default
  2): a lone answer has no same-topic distractor. Each query comes with the one answer it is judged
  against.
* **The shared split, unchanged.** Every query keeps the split it has in the shared folder (split by
  source document, so no test focus of a source is seen in training). The 26 answers that the shared
  folder judges relevant for queries of more than one split (deduplicated boiler-plate such as GHR's
  inheritance paragraphs) are left out with their queries, so the splits are disjoint by document.
* **Quotas per split.** Clusters are visited in a seeded shuffle; one is taken when it keeps every split
  within its query quota (default train 1000, dev 150, test 300), until the corpus quota (default 1600
  answers) is reached. Test gets more than its MedQuAD share so its nDCG@10 is not a coin toss.

Written by hand because it is a few lines of bookkeeping over three files; the output is checked
(unique ids, every query judged, splits disjoint by document) before the folder is swapped in whole
(:func:`medadapt.io.replace_folder`).
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("train", "dev", "test")


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_qrels(path: Path) -> list[tuple[str, str, str]]:
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    return [tuple(r) for r in rows[1:] if r and r[0]]


def select(source: Path, seed: int, quotas: dict[str, int], max_docs: int, min_cluster: int = 1) -> dict:
    """Pick clusters; return the corpus rows, query rows and qrels per split of the subset."""
    corpus = read_jsonl(source / "corpus.jsonl")
    queries = read_jsonl(source / "queries.jsonl")
    qrels = {s: read_qrels(source / "qrels" / f"{s}.tsv") for s in SPLITS}
    doc_splits: dict[str, set[str]] = defaultdict(set)
    doc_queries: dict[str, list[tuple[str, str, str]]] = defaultdict(list)  # doc -> (split, query, grade)
    for split, rows in qrels.items():
        for qid, did, grade in rows:
            doc_splits[did].add(split)
            doc_queries[did].append((split, qid, grade))
    shared = {d for d, s in doc_splits.items() if len(s) > 1}
    clusters: dict[str, list[str]] = defaultdict(list)
    for doc in corpus:
        if doc["_id"] in doc_queries and doc["_id"] not in shared:
            clusters[doc.get("title", "").strip().lower()].append(doc["_id"])
    names = sorted(n for n, docs in clusters.items() if len(docs) >= min_cluster)
    random.Random(seed).shuffle(names)
    taken: set[str] = set()
    counts: Counter = Counter()
    for name in names:
        need = Counter(s for d in clusters[name] for s, _, _ in doc_queries[d])
        if any(counts[s] + n > quotas[s] for s, n in need.items()):
            continue
        if len(taken) + len(clusters[name]) > max_docs:
            continue
        taken.update(clusters[name])
        counts.update(need)
        if len(taken) >= max_docs - 2 and all(counts[s] >= quotas[s] - 2 for s in SPLITS):
            break
    judged = {qid for d in taken for _, qid, _ in doc_queries[d]}
    return {
        "corpus": [d for d in corpus if d["_id"] in taken],
        "queries": [q for q in queries if q["_id"] in judged],
        "qrels": {s: [r for r in qrels[s] if r[1] in taken] for s in SPLITS},
        "clusters": sum(1 for n in names if clusters[n][0] in taken),
        "min_cluster": min_cluster,
        "left_out_shared": len(shared),
    }


def check(sub: dict) -> None:
    """The guarantees the README states; a failure stops before anything is written."""
    ids = [d["_id"] for d in sub["corpus"]]
    qids = [q["_id"] for q in sub["queries"]]
    assert len(ids) == len(set(ids)) and len(qids) == len(set(qids)), "repeated ids"
    docs = set(ids)
    seen_q: dict[str, str] = {}
    doc_split: dict[str, str] = {}
    for split, rows in sub["qrels"].items():
        for qid, did, _ in rows:
            assert did in docs, f"{did} judged but not in the corpus"
            assert seen_q.setdefault(qid, split) == split, f"query {qid} in two splits"
            assert doc_split.setdefault(did, split) == split, f"document {did} in two splits"
    assert set(seen_q) == set(qids), "a query without judgements (or judgements of an unknown query)"
    assert set(doc_split) == docs, "a document no query is judged against"


README = """# medquad-mini

A small subset of **MedQuAD** (Ben Abacha & Demner-Fushman 2019) in BEIR layout, shipped with medadapt so
that the first run shows what a trained head adds on real consumer-health questions within a few minutes
of CPU. Query: a consumer-health question; relevant document: its NIH answer (one per query).

| file | contents | count |
|---|---|---|
| `corpus.jsonl` | `{{"_id", "title", "text"}}`, one NIH answer per line | {n_docs} answers in {n_clusters} topic clusters |
| `queries.jsonl` | `{{"_id", "text", "metadata": {{"qtype", "focus", "source"}}}}` | {n_queries} questions |
| `qrels/train.tsv` | `query-id  corpus-id  score` (score 1) | {n_train} queries |
| `qrels/dev.tsv` | same | {n_dev} queries |
| `qrels/test.tsv` | same | {n_test} queries |

Ids are those of the shared MedQuAD folder (`../shared/data/medquad`, 14,220 answers, 14,809 questions,
sources 1-6 of MedQuAD's 12), so results can be traced back to it.

## How it was built

`python benchmarks/make_medquad_mini.py --seed {seed} --min-cluster {min_cluster}` from the shared MedQuAD
folder (deterministic):

* **Whole topic clusters.** A cluster is every answer sharing a title (MedQuAD's focus, case-blind) across
  sources: a disease's symptoms / treatment / outlook / genetics answers, and GARD's and GHR's answers on
  it, stay together, so each question keeps its hardest distractors in the corpus. Only clusters of at
  least {min_cluster} answers are taken: a lone answer has no same-topic distractor.
* **MedQuAD's split, unchanged.** Every question keeps the split of the shared folder, which splits by
  source document, so no test focus of a source is seen in training. The {n_shared} answers that the
  shared folder judges for questions of more than one split (deduplicated boiler-plate paragraphs) are left
  out with their questions: the splits are disjoint by document.
* **Quotas.** Clusters are taken in a seeded shuffle while every split stays within its quota
  (train {q_train}, dev {q_dev}, test {q_test} questions; at most {max_docs} answers). Test holds more
  than its MedQuAD share so its scores are steadier; the corpus is small enough to encode in about two
  minutes on a laptop CPU.

Retrieval runs over the whole corpus (all splits' answers). The frozen all-MiniLM-L6-v2 is clearly
imperfect here: test nDCG@10 0.7815, MRR@10 0.7143 (0.7055 nDCG@10 on the full MedQuAD test split). The
Med-MoE-Embed head of `recipes/med-moe-embed-demo.yaml`, trained on the 1,000 train questions, reaches
0.8950 / 0.8598 (measured 2026-11-23 on 2 CPU cores; see `docs/benchmarks.md`). Selecting only clusters of
two or more answers makes the set harder: with lone answers allowed (`--min-cluster 1`) the frozen model
scores 0.805 on test.

## License

MedQuAD is released under the **Creative Commons Attribution 4.0 International license (CC BY 4.0)**,
<https://creativecommons.org/licenses/by/4.0/>. This subset is a derivative (a selection of its questions and
answers, regrouped into a BEIR folder; no text was edited) and is distributed under the same license.
Please cite:

> Asma Ben Abacha and Dina Demner-Fushman. A question-entailment approach to question answering.
> BMC Bioinformatics 20, 511 (2019). https://doi.org/10.1186/s12859-019-3119-4
> Data: https://github.com/abachaa/MedQuAD

The answers are NIH consumer-health texts (cancer.gov, GARD, Genetics Home Reference, MedlinePlus, NIDDK,
NINDS). They are not medical advice.
"""


def write(sub: dict, out: Path, args) -> None:
    from medadapt.io import replace_folder

    def jsonl(rows: list[dict]) -> str:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

    with replace_folder(out) as tmp:
        (tmp / "qrels").mkdir()
        (tmp / "corpus.jsonl").write_text(jsonl(sub["corpus"]), encoding="utf-8")
        (tmp / "queries.jsonl").write_text(jsonl(sub["queries"]), encoding="utf-8")
        for split, rows in sub["qrels"].items():
            text = "query-id\tcorpus-id\tscore\n" + "".join("\t".join(r) + "\n" for r in rows)
            (tmp / "qrels" / f"{split}.tsv").write_text(text, encoding="utf-8")
        (tmp / "README.md").write_text(README.format(
            n_docs=len(sub["corpus"]), n_clusters=sub["clusters"], n_queries=len(sub["queries"]),
            n_train=len(sub["qrels"]["train"]), n_dev=len(sub["qrels"]["dev"]), n_test=len(sub["qrels"]["test"]),
            seed=args.seed, n_shared=sub["left_out_shared"], q_train=args.train, q_dev=args.dev, q_test=args.test,
            max_docs=args.max_docs, min_cluster=sub["min_cluster"]), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=REPO.parent / "shared" / "data" / "medquad")
    p.add_argument("--out", type=Path, default=REPO / "medadapt" / "data" / "builtin" / "medquad-mini")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train", type=int, default=1000, help="train query quota")
    p.add_argument("--dev", type=int, default=150, help="dev query quota")
    p.add_argument("--test", type=int, default=300, help="test query quota")
    p.add_argument("--max-docs", type=int, default=1600, help="corpus quota (answers)")
    p.add_argument("--min-cluster", type=int, default=2, help="take only clusters of at least this many answers")
    args = p.parse_args(argv)
    sub = select(args.source, args.seed, {"train": args.train, "dev": args.dev, "test": args.test}, args.max_docs,
                 args.min_cluster)
    check(sub)
    write(sub, args.out, args)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"{args.out}: {len(sub['corpus'])} answers in {sub['clusters']} clusters, {len(sub['queries'])} questions "
          f"(train {len(sub['qrels']['train'])}, dev {len(sub['qrels']['dev'])}, test {len(sub['qrels']['test'])}), "
          f"{size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
