"""Relevance rubrics as data: levels, positive grades (medadapt's choice, :meth:`Rubric.with_positive`) and
the papers' prompts: CMedTEB Appendix F (S-D, a query's passages in one prompt) and CURE Appendix B (0-2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

CMEDTEB_TEMPLATE = """\
This is a medical information retrieval task: given a medical query (Query), retrieve documents (Passages) that can answer the question.
Given a medical query (Query) and {num_passages} passages, your task is to rate the relevance between the Query and each Passage.
Relevance scoring criteria:
S: The subject (e.g., disease name, drug name, inquiry target) and intent of Query and Passage are fully consistent. The Passage can directly, completely, and correctly answer the Query.
A: The subject and intent of Query and Passage are consistent. The Passage contains content that can directly and correctly answer the Query.
B: The subject of Query and Passage is consistent, but the intent differs. The Passage cannot directly answer the Query, but it is useful for inference.
C: The subject of Query and Passage is related, but the intent is inconsistent. It can only partially match the Query from the text, but cannot answer the Query.
D: The subject and intent of Query and Passage are unrelated. Cannot answer the Query.
Notes:
1. Query and Passage are independent; there is no contextual relationship. Do not infer or supplement the subject/intent of Query based on Passage.
2. If the Query is low-quality (e.g., missing subject, like "How to treat this disease?"), the maximum relevance score for all Passages should not exceed B.
3. All Passages are independent; they are randomly ordered and have no contextual relationship.
Output format:
Your output must be a JSON object, containing only the required fields. The format is as follows:
{{ "Passage-0": "A", "Passage-1": "C", ... }}
Query and Passages are as follows:
- Query: {query}
{passages}
Remember: do not output any other content or explanation.
Your output must be only a JSON object with the required fields. Output:"""

CURE_TEMPLATE = """\
You are a {clinical_role}, who consults academic journals to ensure that you provide care that is in accordance with best practices. Here, you will be presented a query you constructed along with a retrieved passage from a scientific article. Your task is to assign a score on an integer scale of 0 to 2 based on the degree to which the passage contains an actionable answer to your query:
2: Assign a score of 2 if the passage is dedicated to the query and contains the exact answer
1: Assign a score of 1 if the passage has some answer for the query but the answer is a bit unclear, or hidden amongst extraneous information
0: Assign a score of 0 if the passage seems related to the query but does not answer it OR if the passage has nothing to do with the query
Note: The article title is provided to help you contextualize the passage.
# Important Instruction
Split this task into steps:
1. Identify the underlying information need of the search from the perspective of a trained {profession} seeking to provide informed patient care.
2. Measure how well the passage satisfies the information need expressed by the query. Carefully consider details in both the query and the passage.
3. Before scoring the passage, write a careful explanation justifying your score that includes a detailed rationale.
4. Provide each score in the format of a JSON with the following structure:
{{
"explanation": "Careful explanation justifying your score that includes a detailed rationale",
"score": "Your final assigned score based on the explanation. One of: 0, 1, 2"
}}
-------
Query: {query}
Passage: {passage}
Article Title: {article_title}"""


@dataclass(frozen=True)
class Rubric:
    """A grading scale: ``levels`` best first, ``positive`` grades (label 1), a ``str.format`` template
    grading one passage (``per_passage``) or a query's passages at once, ``defaults`` of extra fields."""

    name: str
    levels: tuple[str, ...]
    positive: frozenset[str]
    template: str
    per_passage: bool
    defaults: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        bad = set(self.positive) - set(self.levels)
        if bad:
            raise ValueError(f"positive grades {sorted(bad)} are not levels of rubric {self.name!r}")

    def label(self, grade: str) -> int:
        return int(grade in self.positive)

    def with_positive(self, grades) -> Rubric:
        return replace(self, positive=frozenset(str(g) for g in grades))

    def render(self, query: str, passages: list[str], **fields) -> list[str]:
        """The prompt(s) for one query: one prompt, or one per passage when ``per_passage``."""
        values = {**dict(self.defaults), **fields}
        if self.per_passage:
            return [self.template.format(query=query, passage=p, **values) for p in passages]
        block = "\n".join(f"- Passage-{i}: {p}" for i, p in enumerate(passages))
        return [self.template.format(query=query, passages=block, num_passages=len(passages), **values)]


#: CMedTEB 5-level scale; S and A (the passage answers the query) count as positive.
CMEDTEB_RUBRIC = Rubric("cmedteb", ("S", "A", "B", "C", "D"), frozenset({"S", "A"}), CMEDTEB_TEMPLATE,
                        per_passage=False)

#: CURE 0–2 scale; 2 (exact answer) and 1 (some answer) count as positive.
CURE_RUBRIC = Rubric("cure", ("2", "1", "0"), frozenset({"2", "1"}), CURE_TEMPLATE, per_passage=True,
                     defaults=(("clinical_role", "physician"), ("profession", "physician"),
                               ("article_title", "")))

RUBRICS: dict[str, Rubric] = {r.name: r for r in (CMEDTEB_RUBRIC, CURE_RUBRIC)}


def get_rubric(name: str) -> Rubric:
    if name not in RUBRICS:
        raise ValueError(f"unknown rubric {name!r}; valid rubrics: {', '.join(RUBRICS)}")
    return RUBRICS[name]
