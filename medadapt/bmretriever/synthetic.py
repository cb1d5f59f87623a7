"""Synthetic training data (BMRetriever §3.3, Appendices A.1 and B.2) through pluggable generators.

Instance level (:class:`QueryGenerator`: one query per passage) and task level (:class:`TaskGenerator`:
brainstormed tasks, then examples with attributes drawn from :data:`TASK_ATTRIBUTES`), each generated in rounds
until the number to keep passes the filters or a cap is reached, with the accounting in
:class:`SyntheticReport`. Generators: offline fakes, or LLMs behind a :class:`ChatClient` (local
``transformers`` or an OpenAI-compatible endpoint). Where the paper is silent: docs/bmretriever.md.
"""

from __future__ import annotations

import ast
import json
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol, runtime_checkable

from medadapt.curation.consistency import filter_consistent_groups
from medadapt.curation.openai_backend import BackendError, OpenAIChat
from medadapt.data.training import TrainingGroup

__all__ = [
    "INSTANCE_PROMPT",
    "TASK_ATTRIBUTES",
    "TASK_BRAINSTORM_PROMPT",
    "TASK_EXAMPLE_PROMPT",
    "ChatClient",
    "FakeQueryGenerator",
    "FakeTaskGenerator",
    "LLMQueryGenerator",
    "LLMTaskGenerator",
    "OpenAICompatibleClient",
    "QueryGenerator",
    "SyntheticReport",
    "TaskExample",
    "TaskGenerator",
    "TransformersChatClient",
    "TransformersQueryGenerator",
    "filter_task_groups",
    "generate_instance_data",
    "generate_task_data",
    "sample_attributes",
    "synthesize_query_groups",
    "synthesize_task_groups",
]

#: Instance level (ours: the paper prints the instructions of Appendix B.2, not the prompt around them).
INSTANCE_PROMPT = (
    "Task: {instruction}\n"
    "Read the biomedical passage below and write one query that a user could ask and that this passage "
    "answers. Reply with the query only.\n\nPassage: {passage}\n\nQuery:"
)
#: Appendix A.1, Listing 1 (the paper asks for "about 20" tasks per call: ``{n}``, ``per_call``).
TASK_BRAINSTORM_PROMPT = (
    "Brainstorm a list of potentially useful biomedical text retrieval tasks.\n"
    "Here are a few examples for your reference:\n"
    "1. Provided a scientific claim as query, retrieve documents that help verify or refute the claim.\n"
    "2. Search for documents that answers a FAQ-style query on children's nutrition.\n"
    "Please adhere to the following guidelines:\n"
    "1. Specify what the query is, and what the desired documents are.\n"
    "2. Each retrieval task should cover a wide range of queries, and should not be too specific.\n"
    "3. Focus on biomedical related topics.\n"
    "Your output should always be a python list of strings only, with about {n} elements, and each element "
    "corresponds to a distinct retrieval task in one sentence.\n"
    "Do not explain yourself or output anything else. Be creative!"
)
#: Appendix A.1, Listing 2; ``{task}`` and the :data:`TASK_ATTRIBUTES` names are filled per example. As
#: printed, "at least {num_words} words long" with the value "50 words" reads "at least 50 words words long".
TASK_EXAMPLE_PROMPT = (
    "You have been assigned a biomedical retrieval task: {task}\n"
    "Your mission is to write one biomedical text retrieval example for this task in JSON format. The JSON "
    "object must contain the following keys:\n"
    '1. "user_query": a string, a random user search query specified by the retrieval task.\n'
    '2. "positive_document": a string, a relevant document for the user query.\n'
    '3. "hard_negative_document": a string, a hard negative document that only appears relevant to the '
    "query.\n"
    "Please adhere to the following guidelines:\n"
    '1. The "user_query" should be {query_type}, {query_length}, {clarity}, and diverse in topic.\n'
    "2. All documents should be at least {num_words} words long.\n"
    "3. Both the query and documents should be in English.\n"
    "4. Both the query and documents require {difficulty} level education to understand.\n"
    "Your output must always be a JSON object only, do not explain yourself or output anything else. Be "
    "creative!"
)
#: Appendix A.1: the values each attribute of :data:`TASK_EXAMPLE_PROMPT` is "randomly sampled from".
TASK_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "query_type": ("extremely long-tail", "long-tail", "common"),
    "query_length": ("less than 5 words", "5-10 words", "at least 10 words"),
    "clarity": ("clear", "understandable with some effort", "ambiguous"),
    "num_words": ("50 words", "50-100 words", "200 words", "300 words", "400 words"),
    "difficulty": ("high school", "college", "PhD"),
}


def sample_attributes(rng: random.Random) -> dict[str, str]:
    """One draw of :data:`TASK_ATTRIBUTES`, each attribute uniformly and independently."""
    return {name: rng.choice(values) for name, values in TASK_ATTRIBUTES.items()}


@runtime_checkable
class QueryGenerator(Protocol):
    """Instance-level augmentation: one query per passage (same order)."""

    def generate_queries(self, passages: Sequence[str], instruction: str) -> list[str]: ...


@dataclass
class TaskExample:
    task: str
    query: str
    positive: str
    negative: str


@runtime_checkable
class TaskGenerator(Protocol):
    """Task-level augmentation: brainstorm ``n`` tasks, then one example per call for a task and
    ``attributes`` (a :func:`sample_attributes` draw)."""

    def brainstorm_tasks(self, n: int) -> list[str]: ...

    def generate_example(self, task: str, attributes: Mapping[str, str] | None = None) -> TaskExample: ...


_WORD = re.compile(r"[A-Za-z][A-Za-z\-]{3,}")


class FakeQueryGenerator:
    """Offline stand-in: ``"what about <k words of the passage>"``, seeded by ``(seed, passage)``; ``noise``
    is the share of queries drawn from another passage (for consistency filtering to remove)."""

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
    """Offline task-level generator over ``(topic, description)`` pairs: one task per topic (then
    ``variant 2``, ...); an example's query names the topic and its attributes, the positive is the topic's
    description, the negative the next topic's."""

    def __init__(self, topics: Sequence[tuple[str, str]], seed: int = 0):
        if not topics:
            raise ValueError("FakeTaskGenerator needs at least one (topic, description) pair")
        self.topics, self.seed = list(topics), seed

    def brainstorm_tasks(self, n: int) -> list[str]:
        names = [t for t, _ in self.topics]
        out = []
        for i in range(n):
            round_ = i // len(names)
            suffix = f" (variant {round_ + 1})" if round_ else ""
            out.append(f"Given a question about {names[i % len(names)]}, retrieve passages that answer "
                       f"it{suffix}")
        return out

    def generate_example(self, task: str, attributes: Mapping[str, str] | None = None) -> TaskExample:
        k = next((i for i, (t, _) in enumerate(self.topics) if t in task), 0)
        topic, desc = self.topics[k]
        other, other_desc = self.topics[(k + 1) % len(self.topics)]
        query = f"what is {topic}?"
        if attributes:
            query += " (" + "; ".join(attributes[a] for a in TASK_ATTRIBUTES if a in attributes) + ")"
        return TaskExample(task=task, query=query, positive=f"{topic}: {desc}",
                           negative=f"{other}: {other_desc}")


@runtime_checkable
class ChatClient(Protocol):
    """An LLM behind the LLM generators: one reply (text) per prompt, in order."""

    def complete(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]: ...


class TransformersChatClient:
    """A local ``transformers`` text-generation pipeline (greedy at ``temperature`` 0); models with a chat
    template get each prompt as one user message."""

    def __init__(self, model: str, *, device: str | None = None, batch_size: int = 8,
                 temperature: float = 0.0):
        from transformers import pipeline

        self.pipe = pipeline("text-generation", model=model, device=device)
        self.batch_size, self.temperature = batch_size, temperature
        self.chat = getattr(self.pipe.tokenizer, "chat_template", None) is not None

    def complete(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        inputs = [[{"role": "user", "content": p}] for p in prompts] if self.chat else list(prompts)
        sampling = {"do_sample": True, "temperature": self.temperature} if self.temperature > 0 else \
            {"do_sample": False}
        outputs = self.pipe(inputs, max_new_tokens=max_new_tokens, batch_size=self.batch_size,
                            return_full_text=False, **sampling)
        return [str(o[0]["generated_text"] if not isinstance(o[0]["generated_text"], list)
                    else o[0]["generated_text"][-1]["content"]).strip() for o in outputs]


class OpenAICompatibleClient:
    """:class:`ChatClient` for any OpenAI-compatible endpoint, through
    :class:`~medadapt.curation.OpenAIChat` (one request per prompt, no redirects, no key over plain http to
    another host). The key is read from ``api_key_env`` at each call and never kept on the object."""

    def __init__(self, model: str, *, base_url: str = "https://api.openai.com/v1",
                 api_key_env: str = "OPENAI_API_KEY", timeout: float = 120.0, retries: int = 2,
                 temperature: float = 0.0):
        self.model, self.base_url, self.api_key_env = model, base_url.rstrip("/"), api_key_env
        self.timeout, self.retries, self.temperature = timeout, retries, temperature

    def complete(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        chat = OpenAIChat(self.model, self.base_url, api_key_env=self.api_key_env, temperature=self.temperature,
                          max_tokens=max_new_tokens, timeout=self.timeout, max_retries=self.retries)
        try:
            return [str(chat(p) or "").strip() for p in prompts]
        except BackendError as exc:
            if exc.status not in (401, 403):
                raise
            raise BackendError(f"{exc} (is ${self.api_key_env} set?)", status=exc.status) from None


class LLMQueryGenerator:
    """Instance level over a :class:`ChatClient`: :data:`INSTANCE_PROMPT` per passage, the reply's first line
    is the query."""

    def __init__(self, client: ChatClient, *, max_new_tokens: int = 48, prompt: str = INSTANCE_PROMPT):
        self.client, self.max_new_tokens, self.prompt = client, max_new_tokens, prompt

    def generate_queries(self, passages: Sequence[str], instruction: str) -> list[str]:
        prompts = [self.prompt.format(instruction=instruction, passage=p) for p in passages]
        replies = self.client.complete(prompts, self.max_new_tokens)
        if len(replies) != len(prompts):
            raise ValueError(f"the chat client returned {len(replies)} replies for {len(prompts)} prompts")
        return [r.strip().splitlines()[0].strip() if r.strip() else "" for r in replies]


class TransformersQueryGenerator(LLMQueryGenerator):
    """:class:`LLMQueryGenerator` on a local :class:`TransformersChatClient`."""

    def __init__(self, model: str, *, max_new_tokens: int = 48, batch_size: int = 8, device: str | None = None,
                 prompt: str = INSTANCE_PROMPT):
        super().__init__(TransformersChatClient(model, device=device, batch_size=batch_size),
                         max_new_tokens=max_new_tokens, prompt=prompt)


class LLMTaskGenerator:
    """Task level over a :class:`ChatClient` (paper: GPT-4): tasks brainstormed ``per_call`` at a time
    (Listing 1) in at most ``max_calls`` calls (default: three times the calls needed), then one JSON example
    per call (Listing 2). A reply that is not what was asked for yields nothing and counts in ``rejected``.
    At temperature 0 every brainstorm call gets the same reply."""

    def __init__(self, client: ChatClient, *, per_call: int = 20, max_new_tokens: int = 512,
                 max_calls: int | None = None):
        self.client, self.per_call, self.max_new_tokens = client, per_call, max_new_tokens
        self.max_calls, self.rejected = max_calls, 0

    def brainstorm_tasks(self, n: int) -> list[str]:
        tasks: list[str] = []
        calls, limit = 0, self.max_calls if self.max_calls is not None else 3 * (n // self.per_call + 1)
        while len(tasks) < n and calls < limit:
            calls += 1
            prompt = TASK_BRAINSTORM_PROMPT.format(n=self.per_call)
            reply = self.client.complete([prompt], self.max_new_tokens)[0]
            try:
                items = parse_json_reply(reply)
            except ValueError:
                self.rejected += 1
                continue
            for t in items if isinstance(items, list) else []:
                if isinstance(t, str) and t.strip() and t.strip() not in tasks:
                    tasks.append(t.strip())
        return tasks[:n]

    def generate_example(self, task: str, attributes: Mapping[str, str] | None = None) -> TaskExample:
        attributes = attributes if attributes is not None else sample_attributes(random.Random(task))
        prompt = TASK_EXAMPLE_PROMPT.format(task=task, **attributes)
        reply = self.client.complete([prompt], self.max_new_tokens)[0]
        try:
            obj = parse_json_reply(reply)
            return TaskExample(task=task, query=str(_field(obj, "user_query", "query")),
                               positive=str(_field(obj, "positive_document", "positive")),
                               negative=str(_field(obj, "hard_negative_document", "negative")))
        except (ValueError, KeyError, TypeError):
            self.rejected += 1
            return TaskExample(task=task, query="", positive="", negative="")


def _field(obj, *names: str):
    for name in names:
        if name in obj:
            return obj[name]
    raise KeyError(names[0])


def synthesize_query_groups(passages: Sequence[str], generator: QueryGenerator, instruction: str, searcher,
                            text_to_id: dict[str, str], *, top_k: int = 3,
                            show_progress: bool = True) -> list[TrainingGroup]:
    """One query per passage, kept when ``searcher`` ranks its passage in its top ``top_k``
    (:func:`generate_instance_data` in one round); groups carry ``instruction`` and no negatives yet."""
    passages = list(passages)
    if not passages:
        return []
    return generate_instance_data(passages, generator, instruction, searcher, text_to_id, target=len(passages),
                                  top_k=top_k, show_progress=show_progress)[0]


def synthesize_task_groups(generator: TaskGenerator, n_tasks: int, examples_per_task: int = 1, *,
                           seed: int = 0) -> list[TrainingGroup]:
    """:func:`generate_task_data` with one attempt per example and no filter, without the report."""
    return generate_task_data(generator, tasks=n_tasks, examples_per_task=examples_per_task, seed=seed)[0]


@dataclass
class SyntheticReport:
    """What one synthetic source produced: of ``generated`` (at most ``max_generated``), ``rejected`` (empty
    or not the JSON asked for), ``duplicates`` (a query its task had), ``filtered`` and ``passed``; ``kept``
    (at most ``target``) train. ``stopped``: ``target``, ``cap`` or ``exhausted``."""

    name: str
    level: str  # "instance" or "task"
    target: int
    max_generated: int
    generated: int = 0
    rejected: int = 0
    duplicates: int = 0
    filtered: int = 0
    passed: int = 0
    kept: int = 0
    rounds: int = 0
    stopped: str = ""
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """JSON-ready, with ``kept_per_generated`` (``train_log.json`` under ``synthetic``)."""
        out = asdict(self)
        out["kept_per_generated"] = round(self.kept / self.generated, 4) if self.generated else None
        return out

    def summary(self) -> str:
        """One log line: kept / generated, the target and cap, why it stopped."""
        why = {"target": "target reached", "cap": "generation cap reached",
               "exhausted": "no passages left" if self.level == "instance" else "no tasks left"}
        counts = ((self.rejected, "rejected replies"), (self.duplicates, "duplicates"),
                  (self.filtered, "filtered out"))
        parts = "".join(f"; {n:,} {what}" for n, what in counts if n)
        return (f"synthetic {self.level} level {self.name}: kept {self.kept:,} of {self.generated:,} "
                f"generated (target {self.target:,}, at most {self.max_generated:,}{parts}); "
                f"{why.get(self.stopped, self.stopped)}")


def _round_size(need: int, generated: int, passed: int, room: int) -> int:
    """The next round's size for ``need`` more: ``need`` over the keep rate so far (first ``need``; twice
    what was generated while nothing passed), in ``[1, room]``."""
    if generated == 0:
        size = need
    elif passed == 0:
        size = max(need, 2 * generated)
    else:
        size = math.ceil(need * generated / passed)
    return max(1, min(size, room))


def generate_instance_data(
    passages: Sequence[str],
    generator: QueryGenerator,
    instruction: str,
    searcher,
    text_to_id: dict[str, str],
    *,
    target: int,
    max_generated: int | None = None,
    top_k: int = 3,
    name: str = "synthetic",
    show_progress: bool = True,
) -> tuple[list[TrainingGroup], SyntheticReport]:
    """Queries for ``passages`` in the order given, in rounds, until ``target`` pairs pass consistency
    filtering (the passage in ``searcher``'s top ``top_k``), ``max_generated`` were asked for, or the
    passages run out. Returns the kept groups (``instruction`` as their prompt) and the report."""
    if target < 1:
        raise ValueError(f"target must be >= 1, got {target}")
    passages = list(passages)
    cap = len(passages) if max_generated is None else min(max_generated, len(passages))
    report = SyntheticReport(name, "instance", target, max_generated if max_generated is not None else cap)
    kept: list[TrainingGroup] = []
    while len(kept) < target and report.generated < cap:
        size = _round_size(target - len(kept), report.generated, report.passed, cap - report.generated)
        batch = passages[report.generated:report.generated + size]
        queries = generator.generate_queries(batch, instruction)
        if len(queries) != len(batch):
            raise ValueError(f"the generator returned {len(queries)} queries for {len(batch)} passages")
        groups = [TrainingGroup(query=q, pos=[p], prompt=instruction)
                  for q, p in zip(queries, batch) if q.strip()]
        passed = filter_consistent_groups(groups, searcher, text_to_id, top_k=top_k,
                                          show_progress=show_progress) if groups else []
        report.generated += len(batch)
        report.rejected += len(batch) - len(groups)
        report.filtered += len(groups) - len(passed)
        report.passed += len(passed)
        report.rounds += 1
        kept += passed[:target - len(kept)]
    report.kept = len(kept)
    capped = max_generated is not None and report.generated >= max_generated
    report.stopped = "target" if report.kept >= target else "cap" if capped else "exhausted"
    return kept, report


def generate_task_data(
    generator: TaskGenerator,
    *,
    tasks: int,
    examples_per_task: int = 1,
    max_generated_per_task: int | None = None,
    seed: int = 0,
    keep: Callable[[list[TrainingGroup]], list[TrainingGroup]] | None = None,
    name: str = "synthetic-task",
) -> tuple[list[TrainingGroup], SyntheticReport]:
    """Brainstorm ``tasks`` distinct tasks, then, in rounds, examples per task until ``examples_per_task``
    are kept or ``max_generated_per_task`` (default ``examples_per_task``) were asked for; each with its own
    attribute draw seeded by ``(seed, task, attempt)``, each round filtered by ``keep`` (``None``: keep all).
    Returns the kept groups (each ``prompt`` its task) and the report."""
    if tasks < 1 or examples_per_task < 1:
        raise ValueError("tasks and examples_per_task must be >= 1")
    per_task = max_generated_per_task if max_generated_per_task is not None else examples_per_task
    if per_task < examples_per_task:
        raise ValueError("max_generated_per_task must be >= examples_per_task")
    brainstormed = (t.strip() for t in generator.brainstorm_tasks(tasks) if t and t.strip())
    names = list(dict.fromkeys(brainstormed))[:tasks]
    report = SyntheticReport(name, "task", tasks * examples_per_task, tasks * per_task,
                             details={"tasks_asked": tasks, "tasks": len(names),
                                      "examples_per_task": examples_per_task})
    kept: dict[str, list[TrainingGroup]] = {t: [] for t in names}
    seen: dict[str, set[str]] = {t: set() for t in names}
    tried = dict.fromkeys(names, 0)
    while True:
        active = [t for t in names if len(kept[t]) < examples_per_task and tried[t] < per_task]
        if not active:
            break
        generated, passed = report.generated, report.passed  # the keep rate before this round
        candidates = []
        for t in active:
            need = examples_per_task - len(kept[t])
            for _ in range(_round_size(need, generated, passed, per_task - tried[t])):
                attributes = sample_attributes(random.Random(f"{seed}\x00{t}\x00{tried[t]}"))
                tried[t] += 1
                report.generated += 1
                ex = generator.generate_example(t, attributes)
                if not (ex.query.strip() and ex.positive.strip() and ex.negative.strip()):
                    report.rejected += 1
                elif ex.query.strip() in seen[t]:
                    report.duplicates += 1
                else:
                    seen[t].add(ex.query.strip())
                    candidates.append(TrainingGroup(query=ex.query, pos=[ex.positive], neg=[ex.negative],
                                                    prompt=t))
        good = keep(candidates) if keep is not None and candidates else candidates
        report.filtered += len(candidates) - len(good)
        report.passed += len(good)
        report.rounds += 1
        for g in good:
            if len(kept[g.prompt]) < examples_per_task:
                kept[g.prompt].append(g)
    groups = [g for t in names for g in kept[t]]
    report.kept = len(groups)
    out_of_tasks = len(names) < tasks and all(len(kept[t]) >= examples_per_task for t in names)
    report.stopped = "target" if report.kept >= report.target else "exhausted" if out_of_tasks else "cap"
    return groups, report


def filter_task_groups(groups: Sequence[TrainingGroup], model, *, batch_size: int = 64) -> list[TrainingGroup]:
    """Keep an example only when ``model`` (the base retriever) scores its positive above its hard negative
    (``encode_query`` / ``encode_document``, the model's own similarity)."""
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
    """The first JSON value in an LLM reply, or a python literal (Listing 1 asks for a python list)."""
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    if start < 0:
        raise ValueError(f"no JSON in reply: {text[:80]!r}")
    try:
        return json.JSONDecoder().raw_decode(text[start:])[0]
    except json.JSONDecodeError:
        end = text.rfind("]" if text[start] == "[" else "}")
        try:
            return ast.literal_eval(text[start:end + 1])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise ValueError(f"no JSON in reply: {text[:80]!r}") from None
