"""C-MTEB retrieval as the HyReC paper evaluates it (Table 1; Tables 5-7): the eight retrieval tasks of C-MTEB
(Xiao et al. 2023), their dev split, nDCG@10 as the main score and the unweighted eight-task average.

=====================  ======  ==============================================================
task (folder)          paper   layout under ``DIR/<task>/`` (BEIR)
=====================  ======  ==============================================================
``T2Retrieval``        T2      ``corpus.jsonl``, ``queries.jsonl``, ``qrels/dev.tsv``
``MMarcoRetrieval``    MM      same
``DuRetrieval``        Du      same
``CovidRetrieval``     Covid   same
``CmedqaRetrieval``    Cmed    same
``EcomRetrieval``      Ecom    same
``MedicalRetrieval``   Med     same
``VideoRetrieval``     Video   same
=====================  ======  ==============================================================

Run with ``--split dev`` (C-MTEB publishes dev qrels only; the paper's tables are "development settings"):
``medadapt eval --suite cmteb --data-dir DIR --split dev --model M``. The sets are on the Hugging Face hub as
``C-MTEB/<task>`` (corpus, queries) and ``C-MTEB/<task>-qrels`` (dev); write each as a BEIR folder named after
the task. Missing task folders are one error listing them all; ``--suite-tasks`` evaluates a subset (the
average is then not reported, as in every suite).

Metrics: nDCG@10 (Table 1, main), Recall@10 (Table 5), MRR@10 (Table 6), MAP@10 (Table 7), computed with
pytrec_eval as C-MTEB / mteb compute them (the paper names Pyserini, whose trec_eval gives the same cut-off
metrics). Averages: ``avg`` is Table 1's "Avg" (mean nDCG@10 of the eight tasks), ``avg_recall@10``,
``avg_mrr@10``, ``avg_map@10`` those of Tables 5-7. No instructions: the paper encodes queries and passages
without one (a model declared instruction-aware keeps its own prompt). A model with a learned-lexical branch
is scored on its default side (hybrid, the paper's "HyReC-hybrid" rows); its lexical and dense rows are
``medadapt eval --data DIR/<task> --split dev --mode lexical|dense``. Reference (Table 1, nDCG@10 x 100, in
the order above): HyReC-small-hybrid 80.52 73.29 82.82 76.47 34.93 61.43 53.27 71.14 -> 66.73;
BAAI/bge-small-zh 77.59 67.56 77.89 68.95 35.18 58.17 49.9 69.33 -> 63.07.
"""

from __future__ import annotations

from pathlib import Path

from medadapt.errors import DataError
from medadapt.eval.suites.base import AverageSpec, SuiteSpec, TaskSpec
from medadapt.eval.tasks.retrieval import RetrievalTask

__all__ = ["CMTEBRetrievalTask", "METRICS", "SUITE", "TASK_NAMES"]

#: the eight tasks in the paper's column order (T2, MM, Du, Covid, Cmed, Ecom, Med, Video)
TASK_NAMES = ("T2Retrieval", "MMarcoRetrieval", "DuRetrieval", "CovidRetrieval", "CmedqaRetrieval",
              "EcomRetrieval", "MedicalRetrieval", "VideoRetrieval")
METRICS = ("ndcg@10", "recall@10", "mrr@10", "map@10")
SPLIT = "dev"


class CMTEBRetrievalTask(RetrievalTask):
    """A retrieval task of this suite: a missing folder names every missing task of the suite at once, and a
    split without qrels where ``dev`` has them says that the paper evaluates ``dev``."""

    def load(self, folder: str | Path, split: str = "test") -> RetrievalTask:
        folder, name = Path(folder), self.metadata.name
        if not (folder / name).is_dir():
            missing = [t for t in TASK_NAMES if not (folder / t).is_dir()]
            raise DataError(f"C-MTEB retrieval: {len(missing)} of {len(TASK_NAMES)} task folders missing from "
                            f"{folder}: {', '.join(missing)} (each a BEIR folder: corpus.jsonl, queries.jsonl, "
                            f"qrels/{SPLIT}.tsv); evaluate the others with --suite-tasks")
        if split != SPLIT and not (folder / name / "qrels" / f"{split}.tsv").is_file() \
                and (folder / name / "qrels" / f"{SPLIT}.tsv").is_file():
            raise DataError(f"{name}: no qrels for split {split!r}; C-MTEB publishes the dev split, which the "
                            f"HyReC paper evaluates: use --split {SPLIT}")
        return super().load(folder, split)


TASKS = tuple(CMTEBRetrievalTask(TaskSpec(name, "retrieval", METRICS, "ndcg@10", query_languages=("zh",),
                                          corpus_language="zh", family="C-MTEB"))
              for name in TASK_NAMES)


def _average(metric: str, name: str, table: str) -> AverageSpec:
    return AverageSpec(name, tuple((t, None, metric) for t in TASK_NAMES),
                       f"{table}: unweighted mean {metric} of the eight tasks")


SUITE = SuiteSpec(
    name="cmteb",
    title="C-MTEB retrieval (HyReC, Table 1)",
    tasks=TASKS,
    averages=(_average("ndcg@10", "avg", "Table 1 Avg"), _average("recall@10", "avg_recall@10", "Table 5 Avg"),
              _average("mrr@10", "avg_mrr@10", "Table 6 Avg"), _average("map@10", "avg_map@10", "Table 7 Avg")),
    reference="HyReC (Tables 1, 5-7; C-MTEB retrieval, dev)",
)
