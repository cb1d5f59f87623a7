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
Metrics are medadapt's ``recall@10``, ``precision@10``, ``f1@10`` (per-query harmonic mean), ``map@10`` and
``accuracy@10`` (share of queries with a relevant document in the top 10); the main score is ``f1@10``, the
metric the paper's text leads with. No instructions: Med-MoE-Embed encodes queries and documents with the
backbone as is. The paper reports no average over data sets, so the suite reports none.
"""

from __future__ import annotations

from medadapt.eval.suites.base import SuiteSpec, TaskSpec

METRICS = ("recall@10", "precision@10", "f1@10", "map@10", "accuracy@10")

TASKS = (
    TaskSpec("MPD-Title", "retrieval", METRICS, "f1@10", family="MPD"),
    TaskSpec("MPD-RP", "retrieval", METRICS, "f1@10", family="MPD"),
    TaskSpec("MMD", "retrieval", METRICS, "f1@10", query_languages=("zh",), corpus_language="zh", family="MMD"),
    TaskSpec("MCQA-Retri", "retrieval", METRICS, "f1@10", family="MCQA"),
)

SUITE = SuiteSpec(name="medmoe", title="Med-MoE-Embed (Tables I-III, top-10)", tasks=TASKS, averages=(),
                  reference="Med-MoE-Embed (Tables I-III, V, VI)")
