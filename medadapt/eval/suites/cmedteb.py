"""CMedTEB (CARE paper, Tables 2, 6, 7): five Chinese medical tasks and the five-task average.

======================  =======  ============  =============================================================
task (folder)           kind     metric        layout under ``DIR/<task>/``
======================  =======  ============  =============================================================
``CMedQAv1-reranking``  rerank   MAP@10        ``test.jsonl``, MTEB reranking rows (``C-MTEB/CMedQAv1-reranking``)
``CMedQAv2-reranking``  rerank   MAP@10        ``test.jsonl``, MTEB reranking rows (``C-MTEB/CMedQAv2-reranking``)
``CMedTEB-Retrieval``   retr.    nDCG@10       BEIR / MTEB retrieval: ``corpus.jsonl``, ``queries.jsonl``,
                                               ``qrels/test.tsv``
``CMedTEB-Rerank``      rerank   MAP@10        ``test.jsonl``, MTEB reranking rows
``CMedTEB-STS``         sts      Pearson       ``test.jsonl``, MTEB STS rows (``sentence1``, ``sentence2``,
                                               ``score``)
======================  =======  ============  =============================================================

Instructions: Table 6, query side only (the paper gives none for documents); STS puts its instruction on
both sentences. The prompt is ``"Instruct: {instruction}\\nQuery: "``, the format of the instruction-tuned
baselines the paper compares (gte-Qwen2, Qwen3-Embedding). By default (``instructions="auto"``) only a model
declared instruction-aware gets it (:func:`~medadapt.eval.suites.base.instruction_aware`); any other model
(one saved without an instruction prompt, as CARE's BERT query tower) keeps its own prompts, as under mteb;
``instructions="on"`` / ``"off"`` (``--instructions``) override.

Averages (Table 2 / Table 11, scores in 0-1 where the paper prints percent): ``avg`` is the unweighted mean
of the five main scores (Table 2's "Avg"); ``avg_cmed`` the mean of the two CMedQA tasks and ``avg_new`` the
mean of the three new tasks (Table 11). Table 2's baselines are fine-tuned (§C: two epochs on the paper's
training data), Table 11's are zero-shot: a public checkpoint compares with Table 11 (gte-multilingual-base:
86.11, 87.40 | 47.80, 61.51, 72.39 -> avg_cmed 86.76, avg_new 60.57), a model fine-tuned on that data with
Table 2 (bge-small-zh-v1.5: 80.21, 81.69, 44.33, 62.30, 70.50 -> avg 67.81).
"""

from __future__ import annotations

from medadapt.eval.suites.base import AverageSpec, SuiteSpec, TaskSpec

RERANK = ("Based on a Chinese medical question, evaluate and rank the medical information that provide answers "
          "to the question.")
RETRIEVAL = "Given a Chinese medical question, retrieve medical documents that answer the question."
STS = "Retrieve semantically similar text."

_ZH = {"query_languages": ("zh",), "corpus_language": "zh"}

RERANK_METRICS = ("map@10", "ndcg@10", "mrr@10")


def _rerank(name: str) -> TaskSpec:
    return TaskSpec(name, "rerank", RERANK_METRICS, "map@10", RERANK, family="rerank", layout="mteb", **_ZH)


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
