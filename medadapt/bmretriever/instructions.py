"""BMRetriever's instruction formats (Appendix B) as data.

Queries and passages are encoded as ``E(I ⊕ text)`` (§3.1): an instruction ``I`` is prepended to every text.
In sentence-transformers terms these are *prompts*: the query prompt goes to ``anchor`` columns and to
``encode_query``, the passage prompt to ``positive`` / ``negative`` columns and to ``encode_document``.

* Pre-training (Appendix B.1): query ``"Given a query, retrieve passages that are relevant to the query.
  Query: {}"``, passage ``"Represent this passage. Passage: {}"``.
* Fine-tuning (Appendix B.2, Table 9): one query instruction per task; passages keep the pre-training
  passage instruction.
* Evaluation (Table 10): one query instruction per evaluation data set.

The recipes carry these tables (``instructions:`` section, validated by
:class:`~medadapt.bmretriever.recipe.InstructionsSection`); the constants below are the defaults.
"""

from __future__ import annotations

from medadapt.eval.suites.bmretriever import INSTRUCTIONS as SUITE_INSTRUCTIONS

__all__ = [
    "EVAL_INSTRUCTIONS",
    "FINETUNE_INSTRUCTIONS",
    "PASSAGE_PROMPT",
    "PRETRAIN_QUERY_PROMPT",
    "QUERY_TEMPLATE",
    "SYNTHETIC_INSTRUCTIONS",
    "query_prompt",
]

PRETRAIN_QUERY_PROMPT = "Given a query, retrieve passages that are relevant to the query. Query: "
PASSAGE_PROMPT = "Represent this passage. Passage: "
#: How a task instruction becomes a query prompt (``{instruction}`` is replaced).
QUERY_TEMPLATE = "{instruction}\nQuery: "

#: Table 9: labelled fine-tuning data sets -> query instruction.
FINETUNE_INSTRUCTIONS: dict[str, str] = {
    "stackexchange": ("Given a biological query from the stackexchange, retrieve replies most relevant to the "
                      "query"),
    "mednli": "Given a sentence, retrieve sentences with the same meaning",
    "mqp": "Given a sentence, retrieve sentences with the same meaning",
    "medquad": "Given a question, retrieve relevant documents that answer the question",
    "healthcaremagic": ("Given a question with context from online medical forums, retrieve responses that "
                        "best answer the question"),
    "eli5": "Given a question, retrieve the highest voted answers on Reddit forum",
    "gooaq": "Given a question, retrieve relevant passages that answer the question",
    "msmarco": "Given a web search query, retrieve relevant passages that answer the query",
    "nq": "Given a question, retrieve Wikipedia passages that answer the question",
    "fever": "Given a claim, retrieve documents that support or refute the claim",
    "hotpotqa": "Given a complex question, retrieve documents that answer the question",
    "nli": "Given a premise, retrieve hypotheses that are entailed by the premise",
}

#: Appendix B.2: instructions of the synthetic query-generation scenarios.
SYNTHETIC_INSTRUCTIONS: dict[str, str] = {
    "pubmed": "Given a question, retrieve Pubmed passages that answer the question.",
    "meadow": "Given a query on COVID-19, retrieve COVID-19 related articles that answer the query.",
}

#: Table 10: evaluation data sets -> query instruction (one table, kept with the neutral BMRetriever suite,
#: :mod:`medadapt.eval.suites.bmretriever`, which cannot import this system).
EVAL_INSTRUCTIONS: dict[str, str] = dict(SUITE_INSTRUCTIONS)


def query_prompt(instruction: str, template: str = QUERY_TEMPLATE) -> str:
    """The query prompt for a task instruction (``template`` with ``{instruction}`` filled in).

    An empty instruction gives an empty prompt (no instruction at all, e.g. for an off-the-shelf model)."""
    if not instruction:
        return ""
    if "{instruction}" not in template:
        raise ValueError(f"query template {template!r} has no '{{instruction}}' placeholder")
    return template.replace("{instruction}", instruction)
