"""BMRetriever's instruction formats (Appendix B) as data: an instruction is prepended to every text
(``E(I ⊕ text)``, §3.1), i.e. sentence-transformers prompts: the query prompt on ``anchor`` columns and
``encode_query``, the passage prompt on ``positive`` / ``negative`` columns and ``encode_document``. These
are the defaults of a recipe's ``instructions:`` section
(:class:`~medadapt.bmretriever.sections.InstructionsSection`).
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
    """``template`` with ``{instruction}`` filled in; an empty instruction gives an empty prompt."""
    if not instruction:
        return ""
    if "{instruction}" not in template:
        raise ValueError(f"query template {template!r} has no '{{instruction}}' placeholder")
    return template.replace("{instruction}", instruction)
