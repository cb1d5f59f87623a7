"""CMedTEB (CARE paper, Tables 2, 6, 7, 11): five Chinese medical tasks (two CMedQA rerank sets, the new
Retrieval, Rerank and STS tasks; layouts in docs/evaluation.md) and the paper's averages.

Instructions: Table 6, query side only (STS: both sentences), as ``"Instruct: {instruction}\\nQuery: "``, the
format of the instruction-tuned baselines the paper compares. Averages (0-1 where the paper prints percent):
``avg`` of the five main scores (Table 2), ``avg_cmed`` and ``avg_new`` (Table 11). Table 2's baselines are
fine-tuned, Table 11's zero-shot: a public checkpoint compares with Table 11 (gte-multilingual-base: avg_cmed
86.76, avg_new 60.57), a model fine-tuned on the paper's data with Table 2 (bge-small-zh-v1.5: avg 67.81).
"""

from __future__ import annotations

from medadapt.eval.suites.base import AverageSpec, SuiteSpec, TaskSpec

RERANK = ("Based on a Chinese medical question, evaluate and rank the medical information that provide answers "
          "to the question.")
RETRIEVAL = "Given a Chinese medical question, retrieve medical documents that answer the question."
STS = "Retrieve semantically similar text."

_ZH = {"query_languages": ("zh",), "corpus_language": "zh"}


def _rerank(name: str) -> TaskSpec:  # the rerank kind's metrics: MAP@10 (main), nDCG@10, MRR@10
    return TaskSpec(name, "rerank", (), "map@10", RERANK, family="rerank", layout="mteb", **_ZH)


TASKS = (
    _rerank("CMedQAv1-reranking"),
    _rerank("CMedQAv2-reranking"),
    TaskSpec("CMedTEB-Retrieval", "retrieval", ("ndcg@10", "recall@100", "mrr@10"), "ndcg@10", RETRIEVAL,
             family="retrieval", **_ZH),
    _rerank("CMedTEB-Rerank"),
    TaskSpec("CMedTEB-STS", "sts", ("pearson", "spearman"), "pearson", STS, family="sts", **_ZH),
)

SUITE = SuiteSpec(
    name="cmedteb",
    title="CMedTEB (CARE, Table 2)",
    tasks=TASKS,
    averages=(
        AverageSpec("avg", tuple((t.name, None, t.main_metric) for t in TASKS),
                    "Table 2 Avg: unweighted mean of the five tasks' main scores (MAP@10, MAP@10, nDCG@10, MAP@10, "
                    "Pearson)"),
        AverageSpec("avg_cmed",
                    (("CMedQAv1-reranking", None, "map@10"), ("CMedQAv2-reranking", None, "map@10")),
                    "Table 11 Avg CMed: mean MAP@10 of CMedQA v1 and v2"),
        AverageSpec("avg_new", (("CMedTEB-Retrieval", None, "ndcg@10"), ("CMedTEB-Rerank", None, "map@10"),
                                ("CMedTEB-STS", None, "pearson")),
                    "Table 11 Avg New: mean of the three new CMedTEB tasks"),
    ),
    reference="CMedTEB & CARE (Tables 2, 6, 7, 11)",
)
