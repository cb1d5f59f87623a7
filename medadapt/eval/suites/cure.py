"""CURE (Clinia, CUREv1, Table 7): ten clinical domains, each a BEIR folder with its English corpus, graded
relevance 0/1/2 and the same queries in English, French and Spanish (``queries-<lang>.jsonl``: en->en,
fr->en, es->en); an optional ``all`` folder is MTEB's pooled split, reported as its own rows. Layout and how
to write it from ``clinia/CUREv1``: docs/evaluation.md.

Metrics: nDCG@10 (main) and Recall@100; averages per query language over the ten domains (``ndcg@10/en`` ...)
and over all domains and languages. Instruction: MTEB's CUREv1 query prompt (the paper gives none).
"""

from __future__ import annotations

from medadapt.eval.suites.base import AverageSpec, SuiteSpec, TaskSpec

#: MTEB's split names (``CUREv1Splits``) and the paper's domain names (Table 6)
DOMAINS = {
    "dentistry_and_oral_health": "Dentistry and Oral Health",
    "dermatology": "Dermatology",
    "gastroenterology": "Gastroenterology",
    "genetics": "Genetics",
    "neuroscience_and_neurology": "Neuroscience and Neurology",
    "orthopedic_surgery": "Orthopedic Surgery",
    "otorhinolaryngology": "Otorhinolaryngology",
    "plastic_surgery": "Plastic Surgery",
    "psychiatry_and_psychology": "Psychiatry and Psychology",
    "pulmonology": "Pulmonology",
}
LANGUAGES = ("en", "es", "fr")
METRICS = ("ndcg@10", "recall@100")
INSTRUCTION = "Given a question by a medical professional, retrieve relevant passages that best answer the question"

_common = {"kind": "retrieval", "metrics": METRICS, "main_metric": "ndcg@10", "query_instruction": INSTRUCTION,
           "query_languages": LANGUAGES, "corpus_language": "en"}
TASKS = (
    *(TaskSpec(slug, family=name, **_common) for slug, name in DOMAINS.items()),
    TaskSpec("all", family="All (pooled corpus)", optional=True, **_common),
)


def _averages() -> tuple[AverageSpec, ...]:
    out = []
    for metric in METRICS:
        for lang in LANGUAGES:
            out.append(AverageSpec(f"{metric}/{lang}", tuple((d, lang, metric) for d in DOMAINS),
                                   f"mean {metric} of the ten domains, {lang} queries -> English corpus"))
        out.append(AverageSpec(metric, tuple((d, lang, metric) for lang in LANGUAGES for d in DOMAINS),
                               f"mean {metric} of the ten domains x three query languages"))
    return tuple(out)


SUITE = SuiteSpec(name="cure", title="CURE v1 (Table 7)", tasks=TASKS, averages=_averages(),
                  reference="CURE (Tables 6, 7, 8); MTEB CUREv1Retrieval")
