"""Synthetic training data (BMRetriever §3.3, "Synthetic Data Augmentation with LLMs"), pluggable generators.

Two levels, each a small ``Protocol`` so any LLM client plugs in:

* **Instance level** (:class:`QueryGenerator`): given passages of a corpus, write one relevant query per
  passage (the paper: GPT-3.5 on PubMed / Meadow passages). The prompt is :data:`INSTANCE_PROMPT`.
* **Task level** (:class:`TaskGenerator`): brainstorm retrieval *scenarios* (:data:`TASK_BRAINSTORM_PROMPT`),
  then one example per scenario with a query, a positive and a hard-negative passage
  (:data:`TASK_EXAMPLE_PROMPT`; the paper: GPT-4, 20,000 tasks).

Instance-level pairs are noisy, so :func:`synthesize_query_groups` keeps a pair only when a base retriever
ranks its passage in the top 3 for the generated query (consistency filtering,
:func:`medadapt.curation.filter_consistent_groups`).

Shipped generators: :class:`FakeQueryGenerator` / :class:`FakeTaskGenerator` (deterministic, offline; what
the tests use) and :class:`TransformersQueryGenerator` (a local ``transformers`` text-generation pipeline,
for users; not run in tests). The prompt templates paraphrase §3.3; the paper does not print its prompts.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from medadapt.data.training import TrainingGroup

__all__ = [
    "INSTANCE_PROMPT",
    "TASK_BRAINSTORM_PROMPT",
    "TASK_EXAMPLE_PROMPT",
    "FakeQueryGenerator",
    "FakeTaskGenerator",
    "QueryGenerator",
    "TaskExample",
    "TaskGenerator",
    "TransformersQueryGenerator",
    "synthesize_query_groups",
    "synthesize_task_groups",
]

INSTANCE_PROMPT = (
    "Task: {instruction}\n"
    "Read the biomedical passage below and write one query that a user could ask and that this passage "
    "answers. Reply with the query only.\n\nPassage: {passage}\n\nQuery:"
)
TASK_BRAINSTORM_PROMPT = (
    "Brainstorm a list of {n} potentially useful biomedical text retrieval tasks. Each task is one sentence "
    "that starts with 'Given a' and says what the query is and what passages to retrieve. Reply with a JSON "
    "list of strings."
)
TASK_EXAMPLE_PROMPT = (
    "You have been assigned a retrieval task: {task}\n"
    "Write one example for this task as a JSON object with the keys \"query\" (the user query), \"positive\" "
    "(a relevant passage of at least 50 words) and \"negative\" (a hard negative: a passage that looks "
    "relevant but does not satisfy the query)."
)


@runtime_checkable
class QueryGenerator(Protocol):
    """Instance-level augmentation: one query per passage (same order)."""

    def generate_queries(self, passages: Sequence[str], instruction: str) -> list[str]: ...


@dataclass
class TaskExample:
    """One task-level example: its task instruction, query, positive and hard-negative passage."""

    task: str
    query: str
    positive: str
    negative: str


@runtime_checkable
class TaskGenerator(Protocol):
    """Task-level augmentation: brainstorm ``n`` task instructions, then write one example per task."""

    def brainstorm_tasks(self, n: int) -> list[str]: ...

    def generate_example(self, task: str) -> TaskExample: ...


_WORD = re.compile(r"[A-Za-z][A-Za-z\-]{3,}")


class FakeQueryGenerator:
    """Offline stand-in for an LLM: the query is ``"what about <k words of the passage>"``, words drawn
    with a generator seeded by ``(seed, passage)``. ``noise`` is the share of queries made of words from a
    *different* passage (so consistency filtering has something to remove)."""

    def __init__(self, words: int = 4, noise: float = 0.0, seed: int = 0):
        if words < 1 or not 0 <= noise <= 1:
            raise ValueError("words must be >= 1 and noise in [0, 1]")
        self.words, self.noise, self.seed = words, noise, seed

    def generate_queries(self, passages: Sequence[str], instruction: str) -> list[str]:
        out = []
        for i, passage in enumerate(passages):
            rng = random.Random(f"{self.seed}\x00{passage}")
            source = passage
            if len(passages) > 1 and rng.random() < self.noise:
                source = passages[(i + 1 + rng.randrange(len(passages) - 1)) % len(passages)]
            vocab = _WORD.findall(source) or source.split() or ["passage"]
            out.append("what about " + " ".join(rng.choice(vocab) for _ in range(self.words)))
        return out


class FakeTaskGenerator:
    """Offline task-level generator: tasks and examples built from a fixed list of topics."""

    def __init__(self, topics: Sequence[tuple[str, str]], seed: int = 0):
        if not topics:
            raise ValueError("FakeTaskGenerator needs at least one (topic, description) pair")
        self.topics, self.seed = list(topics), seed

    def brainstorm_tasks(self, n: int) -> list[str]:
        names = [t for t, _ in self.topics]
        return [f"Given a question about {names[i % len(names)]}, retrieve passages that answer it"
                for i in range(n)]

    def generate_example(self, task: str) -> TaskExample:
        k = next((i for i, (t, _) in enumerate(self.topics) if t in task), 0)
        topic, desc = self.topics[k]
        other, other_desc = self.topics[(k + 1) % len(self.topics)]
        return TaskExample(task=task, query=f"what is {topic}?", positive=f"{topic}: {desc}",
                           negative=f"{other}: {other_desc}")


class TransformersQueryGenerator:
    """Instance-level generator on a local ``transformers`` text-generation pipeline (any chat / causal LM).

    Not used in tests (it needs a real model). Example::

        gen = TransformersQueryGenerator("Qwen/Qwen2.5-1.5B-Instruct", device="cuda")
        queries = gen.generate_queries(passages, SYNTHETIC_INSTRUCTIONS["pubmed"])
    """

    def __init__(self, model: str, *, max_new_tokens: int = 48, batch_size: int = 8, device: str | None = None,
                 prompt: str = INSTANCE_PROMPT):
        from transformers import pipeline

        self.pipe = pipeline("text-generation", model=model, device=device)
        self.max_new_tokens, self.batch_size, self.prompt = max_new_tokens, batch_size, prompt

    def generate_queries(self, passages: Sequence[str], instruction: str) -> list[str]:
        prompts = [self.prompt.format(instruction=instruction, passage=p) for p in passages]
        outputs = self.pipe(prompts, max_new_tokens=self.max_new_tokens, batch_size=self.batch_size,
                            do_sample=False, return_full_text=False)
        return [o[0]["generated_text"].strip().splitlines()[0].strip() if o[0]["generated_text"].strip() else ""
                for o in outputs]


def synthesize_query_groups(
    passages: Sequence[str],
    generator: QueryGenerator,
    instruction: str,
    searcher,
    text_to_id: dict[str, str],
    *,
    top_k: int = 3,
    show_progress: bool = True,
) -> list[TrainingGroup]:
    """Instance-level augmentation + consistency filtering.

    Generates one query per passage, then keeps ``(query, passage)`` only when ``searcher`` (a base retriever
    over the corpus, :class:`~medadapt.curation.DenseSearcher`) ranks the passage in its top ``top_k``.
    ``text_to_id`` maps passage texts to corpus ids. Empty generations are dropped. The returned groups
    carry ``instruction`` as their ``prompt`` and no negatives yet (mine them like labelled data)."""
    from medadapt.curation import filter_consistent_groups

    passages = list(passages)
    queries = generator.generate_queries(passages, instruction)
    if len(queries) != len(passages):
        raise ValueError(f"the generator returned {len(queries)} queries for {len(passages)} passages")
    groups = [TrainingGroup(query=q, pos=[p], prompt=instruction)
              for q, p in zip(queries, passages) if q.strip()]
    return filter_consistent_groups(groups, searcher, text_to_id, top_k=top_k, show_progress=show_progress)


def synthesize_task_groups(generator: TaskGenerator, n_tasks: int) -> list[TrainingGroup]:
    """Task-level augmentation: ``n_tasks`` scenarios, one (query, positive, hard negative) example each;
    each group's ``prompt`` is its task instruction. Examples with an empty field are dropped."""
    groups = []
    for task in generator.brainstorm_tasks(n_tasks):
        ex = generator.generate_example(task)
        if ex.query.strip() and ex.positive.strip() and ex.negative.strip():
            groups.append(TrainingGroup(query=ex.query, pos=[ex.positive], neg=[ex.negative], prompt=ex.task))
    return groups


def parse_json_reply(text: str):
    """Parse the first JSON value in an LLM reply (code fences and prose around it are ignored)."""
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError(f"no JSON in reply: {text[:80]!r}")
    return json.JSONDecoder().raw_decode(text[start:])[0]
