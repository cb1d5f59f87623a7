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

Task-level examples are filtered the same way in spirit: one is kept only when the base retriever scores
its positive above its hard negative for its query (:func:`filter_task_groups`; the paper filters
instance-level pairs only, this check is ours).

Shipped generators: :class:`FakeQueryGenerator` / :class:`FakeTaskGenerator` (deterministic, offline; what
the tests and the tiny recipe use), and :class:`LLMQueryGenerator` / :class:`LLMTaskGenerator` over a
:class:`ChatClient`: :class:`TransformersChatClient` (a local ``transformers`` causal / chat LM) or
:class:`OpenAICompatibleClient` (any ``/chat/completions`` endpoint: OpenAI, vLLM, TGI, llama.cpp server).
The API key is read from an environment variable at each request (the recipe names the variable, never the
key); it is not stored on the client, written to disk, logged, or echoed in errors. The prompt templates
paraphrase §3.3; the paper does not print its prompts.
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
    "ChatClient",
    "FakeQueryGenerator",
    "FakeTaskGenerator",
    "LLMQueryGenerator",
    "LLMTaskGenerator",
    "OpenAICompatibleClient",
    "QueryGenerator",
    "TaskExample",
    "TaskGenerator",
    "TransformersChatClient",
    "TransformersQueryGenerator",
    "filter_task_groups",
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


@runtime_checkable
class ChatClient(Protocol):
    """An LLM behind the LLM generators: one reply (text) per prompt, in order."""

    def complete(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]: ...


class TransformersChatClient:
    """A local ``transformers`` text-generation pipeline (any causal or chat LM), greedy decoding. Models
    with a chat template get each prompt as one user message. Not run in tests (it needs a real model)."""

    def __init__(self, model: str, *, device: str | None = None, batch_size: int = 8):
        from transformers import pipeline

        self.pipe = pipeline("text-generation", model=model, device=device)
        self.batch_size = batch_size
        self.chat = getattr(self.pipe.tokenizer, "chat_template", None) is not None

    def complete(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        inputs = [[{"role": "user", "content": p}] for p in prompts] if self.chat else list(prompts)
        outputs = self.pipe(inputs, max_new_tokens=max_new_tokens, batch_size=self.batch_size, do_sample=False,
                            return_full_text=False)
        return [str(o[0]["generated_text"] if not isinstance(o[0]["generated_text"], list)
                    else o[0]["generated_text"][-1]["content"]).strip() for o in outputs]


class OpenAICompatibleClient:
    """Any OpenAI-compatible ``POST {base_url}/chat/completions`` endpoint (OpenAI, Azure-style gateways,
    vLLM, TGI, llama.cpp server), through ``httpx``; one request per prompt, temperature 0.

    ``api_key_env`` names the environment variable holding the key; the key is read at each request and
    sent as a bearer token only: it is not kept on the object, logged, or put in any error message. An
    endpoint that needs no key (a local server) works with the variable unset. Why not the ``openai``
    package: one small JSON call does not justify the dependency, and ``httpx`` already ships with the
    Hugging Face stack."""

    def __init__(self, model: str, *, base_url: str = "https://api.openai.com/v1",
                 api_key_env: str = "OPENAI_API_KEY", timeout: float = 120.0, retries: int = 2):
        self.model, self.base_url, self.api_key_env = model, base_url.rstrip("/"), api_key_env
        self.timeout, self.retries = timeout, retries
        self._http = None  # one pooled httpx client for every call (the task level calls once per example)

    def __repr__(self) -> str:
        return f"OpenAICompatibleClient(model={self.model!r}, base_url={self.base_url!r}, " \
               f"api_key_env={self.api_key_env!r})"

    def complete(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        import os

        import httpx

        from medadapt.errors import MedAdaptError

        url = f"{self.base_url}/chat/completions"
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        out = []
        if self._http is None:
            self._http = httpx.Client(timeout=self.timeout)
        client = self._http
        for prompt in prompts:
            body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_new_tokens, "temperature": 0}
            for attempt in range(self.retries + 1):
                try:
                    r = client.post(url, json=body, headers=headers)
                except httpx.HTTPError as exc:  # the message names the URL, never the headers
                    if attempt == self.retries:
                        raise MedAdaptError(f"synthetic data: cannot reach {url}: "
                                            f"{type(exc).__name__}") from None
                    continue
                if r.status_code in (429, 500, 502, 503, 504) and attempt < self.retries:
                    continue
                if r.status_code != 200:
                    hint = f" (is ${self.api_key_env} set?)" if r.status_code in (401, 403) else ""
                    raise MedAdaptError(f"synthetic data: {url} answered HTTP {r.status_code}{hint}")
                break
            try:
                out.append(str(r.json()["choices"][0]["message"]["content"] or "").strip())
            except (ValueError, KeyError, IndexError, TypeError):
                raise MedAdaptError(f"synthetic data: {url} did not answer in the chat-completions "
                                    "format (choices[0].message.content)") from None
        return out


class LLMQueryGenerator:
    """Instance-level generator over any :class:`ChatClient`: :data:`INSTANCE_PROMPT` per passage, the
    first line of the reply is the query (empty replies are dropped later)."""

    def __init__(self, client: ChatClient, *, max_new_tokens: int = 48, prompt: str = INSTANCE_PROMPT):
        self.client, self.max_new_tokens, self.prompt = client, max_new_tokens, prompt

    def generate_queries(self, passages: Sequence[str], instruction: str) -> list[str]:
        prompts = [self.prompt.format(instruction=instruction, passage=p) for p in passages]
        replies = self.client.complete(prompts, self.max_new_tokens)
        if len(replies) != len(prompts):
            raise ValueError(f"the chat client returned {len(replies)} replies for {len(prompts)} prompts")
        return [r.strip().splitlines()[0].strip() if r.strip() else "" for r in replies]


class TransformersQueryGenerator(LLMQueryGenerator):
    """:class:`LLMQueryGenerator` on a local :class:`TransformersChatClient`. Example::

        gen = TransformersQueryGenerator("Qwen/Qwen2.5-1.5B-Instruct", device="cuda")
        queries = gen.generate_queries(passages, SYNTHETIC_INSTRUCTIONS["pubmed"])
    """

    def __init__(self, model: str, *, max_new_tokens: int = 48, batch_size: int = 8, device: str | None = None,
                 prompt: str = INSTANCE_PROMPT):
        super().__init__(TransformersChatClient(model, device=device, batch_size=batch_size),
                         max_new_tokens=max_new_tokens, prompt=prompt)


class LLMTaskGenerator:
    """Task-level generator over any :class:`ChatClient` (the paper: GPT-4). Tasks are brainstormed
    ``per_call`` at a time (:data:`TASK_BRAINSTORM_PROMPT`, a JSON list), duplicates dropped; each example is
    one JSON object (:data:`TASK_EXAMPLE_PROMPT`). A reply that is not the JSON asked for yields nothing
    (counted in ``rejected``) rather than stopping a long generation."""

    def __init__(self, client: ChatClient, *, per_call: int = 20, max_new_tokens: int = 512,
                 max_calls: int | None = None):
        self.client, self.per_call, self.max_new_tokens = client, per_call, max_new_tokens
        self.max_calls, self.rejected = max_calls, 0

    def brainstorm_tasks(self, n: int) -> list[str]:
        tasks: list[str] = []
        calls, limit = 0, self.max_calls if self.max_calls is not None else 3 * (n // self.per_call + 1)
        while len(tasks) < n and calls < limit:
            calls += 1
            reply = self.client.complete([TASK_BRAINSTORM_PROMPT.format(n=min(self.per_call, n - len(tasks)))],
                                         self.max_new_tokens)[0]
            try:
                items = parse_json_reply(reply)
            except ValueError:
                self.rejected += 1
                continue
            for t in items if isinstance(items, list) else []:
                if isinstance(t, str) and t.strip() and t.strip() not in tasks:
                    tasks.append(t.strip())
        return tasks[:n]

    def generate_example(self, task: str) -> TaskExample:
        reply = self.client.complete([TASK_EXAMPLE_PROMPT.format(task=task)], self.max_new_tokens)[0]
        try:
            obj = parse_json_reply(reply)
            return TaskExample(task=task, query=str(obj["query"]), positive=str(obj["positive"]),
                               negative=str(obj["negative"]))
        except (ValueError, KeyError, TypeError):
            self.rejected += 1
            return TaskExample(task=task, query="", positive="", negative="")


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


def filter_task_groups(groups: Sequence[TrainingGroup], model, *, batch_size: int = 64) -> list[TrainingGroup]:
    """Keep a task-level example only when ``model`` (the base retriever, a SentenceTransformer) scores its
    positive above its hard negative for its query (``encode_query`` for the query, ``encode_document`` for
    the passages, the model's own similarity). A generated "hard
    negative" that actually answers the query, or a positive that does not, is dropped."""
    groups = [g for g in groups if g.pos and g.neg]
    if not groups:
        return []
    q = model.encode_query([g.query for g in groups], batch_size=batch_size, convert_to_tensor=True,
                           show_progress_bar=False)
    pos = model.encode_document([g.pos[0] for g in groups], batch_size=batch_size, convert_to_tensor=True,
                                show_progress_bar=False)
    neg = model.encode_document([g.neg[0] for g in groups], batch_size=batch_size, convert_to_tensor=True,
                                show_progress_bar=False)
    sim = model.similarity_pairwise
    keep = (sim(q, pos) > sim(q, neg)).tolist()
    return [g for g, k in zip(groups, keep) if k]


def parse_json_reply(text: str):
    """Parse the first JSON value in an LLM reply (code fences and prose around it are ignored)."""
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError(f"no JSON in reply: {text[:80]!r}")
    return json.JSONDecoder().raw_decode(text[start:])[0]
