"""CURE (Clinia, CUREv1): ten clinical domains, each with its own English corpus, graded relevance 0/1/2,
and the same 2,000 queries in English, French and Spanish: monolingual en->en and cross-lingual fr->en,
es->en.

Layout: one BEIR folder per domain, named by MTEB's split names (``CUREv1Retrieval``)::

    DIR/dentistry_and_oral_health/corpus.jsonl          # the domain's English passages
    DIR/dentistry_and_oral_health/queries-en.jsonl      # the dataset's queries-en / -es / -fr configs
    DIR/dentistry_and_oral_health/queries-es.jsonl
    DIR/dentistry_and_oral_health/queries-fr.jsonl
    DIR/dentistry_and_oral_health/qrels/test.tsv        # query-id, corpus-id, score (0, 1, 2)
    ... nine more domains ...
    DIR/all/...                                         # optional: MTEB's "All" split (pooled corpus)

Hugging Face publishes CURE as ``clinia/CUREv1`` with configs ``corpus``, ``qrels``, ``queries-en``,
``queries-es``, ``queries-fr`` whose splits are the domains; docs/evaluation.md shows the few lines of
``datasets`` that write this layout. Queries of every language go through ``encode_query`` against the same
``encode_document`` corpus (cross-lingual retrieval is the ordinary retrieval task with another queries
file); results are reported per domain and per query language.

Metrics: nDCG@10 (graded gains 0/1/2, main score) and Recall@100 (grade >= 1 relevant), as Table 7.
Averages: for every query language, the unweighted mean over the ten domains (``ndcg@10/en``,
``recall@100/fr``, ...), and over all domains and languages (``ndcg@10``, ``recall@100``). The paper's
Table 7 gives one figure per query language computed with MTEB over the whole set; when ``DIR/all`` is
present it is evaluated too and reported as the ``all`` rows (not part of the domain means).

Instruction: the paper gives none; the suite uses MTEB's CUREv1 query prompt ("Given a question by a
medical professional, retrieve relevant passages that best answer the question"), documents plain, for a
model declared instruction-aware (``instructions="auto"``, the default; ``"on"`` / ``"off"`` override).
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
