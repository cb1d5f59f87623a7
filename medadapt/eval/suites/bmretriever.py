"""BMRetriever's evaluation (§4, Tables 2, 3, 10): eleven data sets in five task families.

==============  ===============  ===============================  =============================================
family          tasks (folders)  metrics (main first)             layout under ``DIR/<task>/``
==============  ===============  ===============================  =============================================
IR              ``nfcorpus``,    nDCG@10                          BEIR (``BeIR/<name>`` on the Hugging Face hub:
                ``scifact``,                                      ``corpus.jsonl``, ``queries.jsonl``,
                ``scidocs``,                                      ``qrels/test.tsv``)
                ``trec-covid``
STS             ``biosses``      Spearman (cosine), Pearson       ``test.jsonl``, MTEB STS rows (``mteb/biosses-sts``)
QA              ``bioasq``,      Recall@5, Recall@20, nDCG@20     ``test.jsonl``, medadapt's pool layout
                ``pubmedqa``,                                     (``{"query", "positives", "negatives"}``,
                ``icliniq``                                       :mod:`medadapt.eval.pool`)
entity linking  ``drugbank``,    Recall@1, Recall@5, MRR@5        ``test.jsonl``, pool layout
                ``mesh``
paper rec.      ``relish``       MAP, nDCG (full lists)           ``test.jsonl``, ``{"query", "candidates"}``
                                                                  (:mod:`medadapt.eval.recommendation`)
==============  ===============  ===============================  =============================================

Instructions: Table 10's query instruction per data set through the template ``"{instruction}\\nQuery: "``,
and the passage prompt ``"Represent this passage. Passage: "`` (Appendix B.1-B.2) on documents; BIOSSES
puts its instruction on both sentences. These are the same strings as ``medadapt.bmretriever``'s tables (a
neutral package may not import a system; ``tests/test_suites.py`` checks the copies agree).

Averages (Table 2): ``avg_retr`` is the mean nDCG@10 of the four IR sets, ``avg_all`` the mean of those four
and BIOSSES' Spearman. E.g. BMRetriever-410M: 0.321, 0.711, 0.167, 0.831 (and 0.840) -> 0.508 (0.574). Table 3
(QA, entity linking, RELISH) reports no average.
"""

from __future__ import annotations

from medadapt.eval.suites.base import AverageSpec, SuiteSpec, TaskSpec

QUERY_TEMPLATE = "{instruction}\nQuery: "
PASSAGE_PROMPT = "Represent this passage. Passage: "

#: Table 10: data set -> query instruction (medadapt.bmretriever.EVAL_INSTRUCTIONS is this table)
INSTRUCTIONS = {
    "nfcorpus": "Given a question, retrieve relevant documents that best answer the question",
    "scifact": "Given a scientific claim, retrieve documents that support or refute the claim",
    "scidocs": "Given a scientific paper title, retrieve paper abstracts that are cited by the given paper",
    "trec-covid": "Given a query on COVID-19, retrieve documents that answer the query",
    "biosses": "Given a sentence, retrieve sentences with the same meaning",
    "bioasq": "Given a question, retrieve Pubmed passages that answer the question",
    "pubmedqa": "Given a question, retrieve Pubmed passages that answer the question",
    "icliniq": ("Given a question with context from online medical forums, retrieve responses that best answer "
                "the question"),
    "drugbank": "Given a drug, retrieve passages for its definition",
    "mesh": "Given a concept, retrieve passages for its definition",
    "relish": "Given an article, retrieve Pubmed articles that are relevant to this article",
}

IR = ("nfcorpus", "scifact", "scidocs", "trec-covid")
QA_METRICS = ("recall@5", "recall@20", "ndcg@20")
EL_METRICS = ("recall@1", "recall@5", "mrr@5")

TASKS = (
    *(TaskSpec(name, "retrieval", ("ndcg@10", "recall@100"), "ndcg@10", INSTRUCTIONS[name], PASSAGE_PROMPT,
               family="IR") for name in IR),
    TaskSpec("biosses", "sts", ("spearman", "pearson"), "spearman", INSTRUCTIONS["biosses"], family="STS"),
    *(TaskSpec(name, "qa", QA_METRICS, "ndcg@20", INSTRUCTIONS[name], PASSAGE_PROMPT, family="QA")
      for name in ("bioasq", "pubmedqa", "icliniq")),
    *(TaskSpec(name, "entity-linking", EL_METRICS, "mrr@5", INSTRUCTIONS[name], PASSAGE_PROMPT, family="entity linking")
      for name in ("drugbank", "mesh")),
    TaskSpec("relish", "recommendation", ("map", "ndcg"), "map", INSTRUCTIONS["relish"], PASSAGE_PROMPT,
             family="paper recommendation"),
)

SUITE = SuiteSpec(
    name="bmretriever",
    title="BMRetriever (Tables 2, 3)",
    tasks=TASKS,
    averages=(
        AverageSpec("avg_retr", tuple((t, None, "ndcg@10") for t in IR),
                    "Table 2 Avg. Retr.: mean nDCG@10 of NFCorpus, SciFact, SciDocs, TREC-COVID"),
        AverageSpec("avg_all", (*((t, None, "ndcg@10") for t in IR), ("biosses", None, "spearman")),
                    "Table 2 Avg. All: mean of the four IR nDCG@10 and BIOSSES Spearman"),
    ),
    query_template=QUERY_TEMPLATE,
    reference="BMRetriever (Tables 2, 3, 10; Appendix B)",
)
