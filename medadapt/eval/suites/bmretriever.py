"""BMRetriever's evaluation (§4, Tables 2, 3, 10): eleven data sets in five task families (IR on BEIR folders,
STS, QA and entity linking in the pool layout, paper recommendation; layouts in docs/evaluation.md).

Instructions: Table 10's query instruction per data set as ``"{instruction}\\nQuery: "`` and the passage
prompt of Appendix B on documents (BIOSSES: the instruction on both sentences); the same strings as
``medadapt.bmretriever``'s tables (a neutral package imports no system; ``tests/test_suites.py`` checks the
copies agree). Averages (Table 2): ``avg_retr`` (four IR nDCG@10) and ``avg_all`` (with BIOSSES' Spearman),
e.g. BMRetriever-410M 0.508 (0.574); Table 3 reports none.
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

TASKS = (
    *(TaskSpec(name, "retrieval", ("ndcg@10", "recall@100"), "ndcg@10", INSTRUCTIONS[name], PASSAGE_PROMPT,
               family="IR") for name in IR),
    TaskSpec("biosses", "sts", ("spearman", "pearson"), "spearman", INSTRUCTIONS["biosses"], family="STS"),
    *(TaskSpec(name, "qa", (), "ndcg@20", INSTRUCTIONS[name], PASSAGE_PROMPT, family="QA")  # the kinds' metrics
      for name in ("bioasq", "pubmedqa", "icliniq")),
    *(TaskSpec(name, "entity-linking", (), "mrr@5", INSTRUCTIONS[name], PASSAGE_PROMPT, family="entity linking")
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
