"""Med-MoE-Embed's evaluation (Tables I-III, V): four BEIR folders (``MPD-Title``, ``MPD-RP``, ``MMD`` in
Chinese, ``MCQA-Retri``) the user builds (the paper publishes none in a retrieval layout), scored at K = 10
with trec's recall and precision and the paper's F1 (main), mAP and Accuracy (:mod:`medadapt.eval.metrics`;
``paper_accuracy`` needs judged non-relevant documents in the qrels), trec's ``f1``, ``map`` and ``accuracy``
beside them. No instructions, no average (the paper reports none).
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
