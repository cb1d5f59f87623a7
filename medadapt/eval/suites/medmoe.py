"""Med-MoE-Embed's evaluation (Tables I-III, V): Recall, Precision, F1, mAP and Accuracy of the top K = 10.

==================  =========  ======================================================================
task (folder)       language   layout under ``DIR/<task>/``
==================  =========  ======================================================================
``MPD-Title``       en         BEIR: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``
``MPD-RP``          en         BEIR
``MMD``             zh         BEIR (the paper evaluates M3E and GTE-zh on it, Table II)
``MCQA-Retri``      en         BEIR (MedMCQA questions; answer explanations as the corpus)
==================  =========  ======================================================================

The paper publishes none of these sets in a retrieval layout (MPD / MMD come from its reference [28];
MCQA-Retri is built from MedMCQA as described in §IV-A), so the suite reads BEIR folders the user builds.
Metrics: ``recall@10`` and ``precision@10`` (trec_eval), and the paper's F1, mAP and Accuracy as its tables
compute them (:mod:`medadapt.eval.metrics`): ``paper_f1@10`` (harmonic mean of the averaged P and R; the
main score, the metric the paper's text leads with), ``paper_map@10`` (AP normalised by the relevant
documents retrieved) and ``paper_accuracy@10`` (classification accuracy over each query's judged documents:
the qrels need the judged non-relevant ones, grade 0, e.g. MCQA-Retri's five BM25 negatives per question).
trec_eval's ``f1@10`` (mean of per-query F1), ``map@10`` and ``accuracy@10`` (success) are reported beside
them under their own names. No instructions: Med-MoE-Embed encodes queries and documents with the backbone
as is. The paper reports no average over data sets, so the suite reports none.
"""

from __future__ import annotations

from medadapt.eval.suites.base import SuiteSpec, TaskSpec

#: the paper's five (Recall, Precision, F1, mAP, Accuracy), then trec_eval's F1, MAP and success for reference
METRICS = ("recall@10", "precision@10", "paper_f1@10", "paper_map@10", "paper_accuracy@10", "f1@10", "map@10",
           "accuracy@10")
MAIN = "paper_f1@10"

TASKS = (
    TaskSpec("MPD-Title", "retrieval", METRICS, MAIN, family="MPD"),
    TaskSpec("MPD-RP", "retrieval", METRICS, MAIN, family="MPD"),
    TaskSpec("MMD", "retrieval", METRICS, MAIN, query_languages=("zh",), corpus_language="zh", family="MMD"),
    TaskSpec("MCQA-Retri", "retrieval", METRICS, MAIN, family="MCQA"),
)

SUITE = SuiteSpec(name="medmoe", title="Med-MoE-Embed (Tables I-III, top-10)", tasks=TASKS, averages=(),
                  reference="Med-MoE-Embed (Tables I-III, V, VI)")
