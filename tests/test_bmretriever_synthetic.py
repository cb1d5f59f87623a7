"""BMRetriever synthetic data (issue #16 item 1, issue 42 item 2): the OpenAI-compatible client against a
local HTTP server (key only in the request header, never in errors, reprs or saved files), Appendix A.1's
prompts and attribute lists, the task-level generator's JSON handling, the positive-above-negative filter
against hand-computed similarities, generate-N-keep-what-passes accounting (rounds, cap, kept / generated),
several instance-level sources, ``medadapt plan``'s synthetic lines, and both levels inside a recipe's
stage II and a run's ``train_log.json``."""

from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from medadapt.bmretriever.synthetic import (
    TASK_ATTRIBUTES,
    TASK_BRAINSTORM_PROMPT,
    TASK_EXAMPLE_PROMPT,
    FakeTaskGenerator,
    LLMQueryGenerator,
    LLMTaskGenerator,
    OpenAICompatibleClient,
    TaskExample,
    filter_task_groups,
    generate_instance_data,
    generate_task_data,
    sample_attributes,
    synthesize_task_groups,
)
from medadapt.data.training import TrainingGroup
from medadapt.errors import MedAdaptError, MedAdaptWarning

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-test-0123456789-do-not-leak"


class _Endpoint:
    """A local ``/v1/chat/completions`` server: answers with ``reply(prompt)``, records every request;
    ``statuses`` (popped first) forces error codes."""

    def __init__(self, reply):
        self.reply, self.requests, self.statuses = reply, [], []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                endpoint.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status = endpoint.statuses.pop(0) if endpoint.statuses else 200
                payload = {"choices": [{"message": {"role": "assistant",
                                                    "content": endpoint.reply(body["messages"][0]["content"])}}]}
                data = json.dumps(payload if status == 200 else {"error": "no"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def endpoint():
    made = []

    def start(reply):
        made.append(_Endpoint(reply))
        return made[-1]

    yield start
    for e in made:
        e.close()


def test_openai_compatible_client_sends_the_key_in_the_header_only(endpoint, monkeypatch):
    monkeypatch.setenv("MEDADAPT_TEST_KEY", SECRET)
    server = endpoint(lambda prompt: f"echo: {prompt[:10]}")
    client = OpenAICompatibleClient("tiny-chat", base_url=server.url, api_key_env="MEDADAPT_TEST_KEY", retries=1)
    assert client.complete(["hello there, model", "second"], max_new_tokens=7) == ["echo: hello ther",
                                                                                   "echo: second"]
    first = server.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert first["body"] == {"model": "tiny-chat", "messages": [{"role": "user", "content": "hello there, model"}],
                             "max_tokens": 7, "temperature": 0}
    assert SECRET not in repr(client) and SECRET not in json.dumps(vars(client), default=repr)

    server.statuses = [503]  # a transient error is retried
    assert client.complete(["again"], 5) == ["echo: again"] and len(server.requests) == 4

    server.statuses = [401]  # not retried
    with pytest.raises(MedAdaptError, match=r"HTTP 401.*\(is \$MEDADAPT_TEST_KEY set\?\)") as err:
        client.complete(["x"], 5)
    assert SECRET not in str(err.value)

    monkeypatch.delenv("MEDADAPT_TEST_KEY")  # a local server without a key: no Authorization header
    client.complete(["no key"], 5)
    assert "Authorization" not in server.requests[-1]["headers"]


def test_llm_generators_parse_replies_and_count_what_they_reject(endpoint):
    def reply(prompt):
        if prompt.startswith("Brainstorm"):
            return 'Sure!\n```json\n["Given a drug, retrieve its side effects", "Given a drug, retrieve its ' \
                   'side effects", "Given a symptom, retrieve likely causes"]\n```'
        if "side effects" in prompt:
            return '{"query": "aspirin side effects", "positive": "Aspirin can cause stomach bleeding.", ' \
                   '"negative": "Aspirin was first made in 1897."}'
        if "passage" in prompt.lower() and "Passage:" in prompt:
            return "what causes gout?\nextra line"
        return "I cannot help with that."  # not the JSON asked for

    client = OpenAICompatibleClient("m", base_url=endpoint(reply).url)
    gen = LLMTaskGenerator(client, per_call=3, max_calls=1)
    groups = synthesize_task_groups(gen, 3)
    assert gen.rejected == 1  # the symptom task's reply was prose: dropped, counted
    assert len(groups) == 1 and groups[0].prompt == "Given a drug, retrieve its side effects"
    assert (groups[0].query, groups[0].pos, groups[0].neg) == (
        "aspirin side effects", ["Aspirin can cause stomach bleeding."], ["Aspirin was first made in 1897."])
    assert LLMQueryGenerator(client).generate_queries(["Gout is caused by uric acid."], "find") == [
        "what causes gout?"]


class _Vectors:
    """A stand-in retriever: fixed vectors per text, cosine similarity (as sentence-transformers computes)."""

    def __init__(self, table):
        self.table = table

    def encode_query(self, texts, **_):
        return torch.tensor([self.table[t] for t in texts], dtype=torch.float32)

    encode_document = encode_query

    @staticmethod
    def similarity_pairwise(a, b):
        return torch.nn.functional.cosine_similarity(a, b)


def test_filter_keeps_an_example_only_when_the_positive_outscores_the_negative():
    model = _Vectors({"q1": [1, 0], "p1": [1, 1], "n1": [0, 1],      # cos 0.707 > 0: kept
                      "q2": [1, 0], "p2": [0, 1], "n2": [2, 0.1],    # cos 0 < 0.999: dropped
                      "q3": [1, 0], "p3": [1, 0]})                   # no negative: dropped
    groups = [TrainingGroup(query="q1", pos=["p1"], neg=["n1"]), TrainingGroup(query="q2", pos=["p2"], neg=["n2"]),
              TrainingGroup(query="q3", pos=["p3"], neg=[])]
    assert [g.query for g in filter_task_groups(groups, model)] == ["q1"]


def test_stage2_builds_instance_and_task_level_data_through_an_endpoint(endpoint, tiny_bert_dir, tiny_beir_dir,
                                                                       tmp_path, monkeypatch):
    from _helpers import bmretriever_overrides as _tiny_overrides

    from medadapt.bmretriever.instructions import query_prompt
    from medadapt.bmretriever import stage2_datasets
    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import load_recipe

    monkeypatch.setenv("MEDADAPT_TEST_KEY", SECRET)

    def reply(prompt):
        if prompt.startswith("Brainstorm"):
            return json.dumps([f"Given a question about topic {i}, retrieve the answer" for i in range(4)])
        if prompt.startswith("You have been assigned"):
            return json.dumps({"query": "symptoms of diabetes", "positive": "diabetes is a condition with thirst",
                               "negative": "asthma is a condition with wheezing"})
        return "symptoms of diabetes"  # instance level: every passage gets the same query

    server = endpoint(reply)
    llm = f"generator: openai, model: tiny-chat, endpoint: '{server.url}', api_key_env: MEDADAPT_TEST_KEY"
    recipe = load_recipe(ROOT / "recipes" / "bmretriever-tiny.yaml", _tiny_overrides(
        "unused", tiny_beir_dir, tiny_bert_dir) + [
        f"stage2.synthetic={{{llm}, passages: 12, top_k: 12}}",
        f"stage2.task_synthetic={{{llm}, tasks: 4, per_call: 4, filter: false}}"])
    report = {}
    data, prompts = stage2_datasets(recipe, cache=EmbeddingCache(tmp_path / "c"), show_progress=False,
                                    log=lambda m: None, report=report)
    assert set(data) == {"medquad", "synthetic", "synthetic-task"}
    assert (report["synthetic"]["generated"], report["synthetic"]["kept"]) == (12, 12)  # the 12-passage corpus
    assert (report["synthetic-task"]["generated"], report["synthetic-task"]["kept"]) == (4, 4)
    assert len(data["synthetic"]) == 12 and len(data["synthetic-task"]) == 4
    task_rows = data["synthetic-task"]
    assert task_rows[0]["anchor"] == query_prompt("Given a question about topic 0, retrieve the answer",
                                                  recipe.instructions.query_template) + "symptoms of diabetes"
    assert task_rows[0]["negative"] == "asthma is a condition with wheezing"
    assert prompts["synthetic-task"] == {"anchor": "", "positive": "passage: ", "negative": "passage: "}
    assert len(server.requests) == 12 + 1 + 4  # 12 passages, 1 brainstorm, 4 examples
    assert all(r["headers"]["Authorization"] == f"Bearer {SECRET}" for r in server.requests)
    assert SECRET not in json.dumps(recipe.model_dump(mode="json"))  # what the run folder's recipe.yaml holds


def test_generator_settings_are_checked():
    from pydantic import ValidationError

    from medadapt.bmretriever.sections import SyntheticSection, TaskSyntheticSection

    with pytest.raises(ValidationError, match="generator 'openai' needs a model"):
        TaskSyntheticSection(generator="openai")
    with pytest.raises(ValidationError, match="api_key_env"):
        SyntheticSection(generator="openai", model="m", api_key_env="sk-abc-123")  # a key, not a variable name
    assert TaskSyntheticSection().generator == "fake"


def test_tiny_recipe_runs_task_level_synthetic_data_with_the_filter(tiny_bert_dir, tiny_beir_dir, tmp_path):
    """The fake task generator on the tiny corpus, filtered by the tiny base retriever: what it keeps is
    what generate_task_data keeps with filter_task_groups called directly, and the report adds up."""
    from _helpers import bmretriever_overrides as _tiny_overrides

    from medadapt.bmretriever import stage2_datasets
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.models import load
    from medadapt.recipes import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "bmretriever-tiny.yaml", _tiny_overrides(
        "unused", tiny_beir_dir, tiny_bert_dir) + ["stage2.task_synthetic={tasks: 12, examples_per_task: 2}"])
    report = {}
    with pytest.warns(MedAdaptWarning, match=r"level synthetic-task: kept \d+, fewer than the target 24 \(cap\)"):
        data, _ = stage2_datasets(recipe, cache=EmbeddingCache(tmp_path / "c"), show_progress=False,
                                  log=lambda m: None, report=report)
    beir = load_beir(tiny_beir_dir, [])
    gen = FakeTaskGenerator([(beir.corpus[d]["title"] or d, beir.corpus[d]["text"]) for d in beir.doc_ids])
    base = load(str(tiny_bert_dir), device="cpu")
    expected, rep = generate_task_data(gen, tasks=12, examples_per_task=2, max_generated_per_task=3, seed=0,
                                       keep=lambda groups: filter_task_groups(groups, base))
    assert 0 < len(expected) <= 24 and rep.filtered > 0  # the tiny retriever rejects some
    assert len(data.get("synthetic-task", [])) == len(expected)
    got = report["synthetic-task"]
    assert {k: got[k] for k in ("generated", "filtered", "kept", "stopped")} == {
        "generated": rep.generated, "filtered": rep.filtered, "kept": rep.kept, "stopped": rep.stopped}
    assert got["generated"] == got["rejected"] + got["duplicates"] + got["filtered"] + got["passed"]


# ------------------------------------------------------------------------------------------- Appendix A.1
def test_prompts_and_attribute_lists_are_appendix_a1():
    assert TASK_ATTRIBUTES == {
        "query_type": ("extremely long-tail", "long-tail", "common"),
        "query_length": ("less than 5 words", "5-10 words", "at least 10 words"),
        "clarity": ("clear", "understandable with some effort", "ambiguous"),
        "num_words": ("50 words", "50-100 words", "200 words", "300 words", "400 words"),
        "difficulty": ("high school", "college", "PhD"),
    }
    brainstorm = TASK_BRAINSTORM_PROMPT.format(n=20)
    assert brainstorm.startswith("Brainstorm a list of potentially useful biomedical text retrieval tasks.\n")
    assert "python list of strings only, with about 20 elements" in brainstorm
    assert "2. Search for documents that answers a FAQ-style query on children's nutrition." in brainstorm
    filled = TASK_EXAMPLE_PROMPT.format(task="Find X", query_type="common", query_length="5-10 words",
                                        clarity="ambiguous", num_words="200 words", difficulty="PhD")
    assert filled.startswith("You have been assigned a biomedical retrieval task: Find X\n")
    assert '1. The "user_query" should be common, 5-10 words, ambiguous, and diverse in topic.' in filled
    assert "2. All documents should be at least 200 words words long." in filled  # as printed
    assert "4. Both the query and documents require PhD level education to understand." in filled
    for key in ('"user_query"', '"positive_document"', '"hard_negative_document"'):
        assert key in filled
    draws = [sample_attributes(random.Random(i)) for i in range(300)]
    assert draws[7] == sample_attributes(random.Random(7))
    for name, values in TASK_ATTRIBUTES.items():  # every value of every list is drawn
        assert {d[name] for d in draws} == set(values)


def test_llm_task_generator_sends_listing_2_with_the_attributes_and_reads_its_keys(endpoint):
    seen = []

    def reply(prompt):
        seen.append(prompt)
        if prompt.startswith("Brainstorm"):
            return "['Given a drug, retrieve its side effects', 'Given a symptom, retrieve causes']"  # python
        return json.dumps({"user_query": "aspirin risks", "positive_document": "Aspirin can cause bleeding.",
                           "hard_negative_document": "Aspirin was first made in 1897."})

    gen = LLMTaskGenerator(OpenAICompatibleClient("m", base_url=endpoint(reply).url), per_call=2, max_calls=1)
    attributes = {"query_type": "long-tail", "query_length": "at least 10 words", "clarity": "clear",
                  "num_words": "50-100 words", "difficulty": "college"}
    tasks = ["Given a drug, retrieve its side effects", "Given a symptom, retrieve causes"]
    assert gen.brainstorm_tasks(2) == tasks
    assert "with about 2 elements" in seen[0]
    assert gen.generate_example("Given a drug, retrieve its side effects", attributes) == TaskExample(
        "Given a drug, retrieve its side effects", "aspirin risks", "Aspirin can cause bleeding.",
        "Aspirin was first made in 1897.")
    assert seen[1] == TASK_EXAMPLE_PROMPT.format(task="Given a drug, retrieve its side effects", **attributes)
    assert gen.rejected == 0


# ------------------------------------------------------------------------------------------- generate N, keep
class _EchoQueries:
    """Query ``q:<passage>``; empty for passages in ``empty``."""

    def __init__(self, empty=()):
        self.empty, self.calls = set(empty), []

    def generate_queries(self, passages, instruction):
        self.calls.append(len(passages))
        return ["" if p in self.empty else f"q:{p}" for p in passages]


class _EvenPasses:
    """A searcher that ranks a query's own passage first only for even-numbered passages ``p<i>``."""

    def __call__(self, query_texts, k):
        return [[(q[2:], 1.0)] if int(q[3:]) % 2 == 0 else [("none", 1.0)] for q in query_texts]


@pytest.mark.parametrize("target, cap, empty, expected", [
    # target reached in two rounds: 4 generated keep 2 (rate 1/2), the next round asks 2 / (1/2) = 4
    (4, 12, (), {"generated": 8, "passed": 4, "filtered": 4, "kept": 4, "rounds": 2, "stopped": "target",
                 "calls": [4, 4]}),
    # the cap stops it: 6, then only 2 more allowed
    (6, 8, (), {"generated": 8, "passed": 4, "filtered": 4, "kept": 4, "rounds": 2, "stopped": "cap",
                "calls": [6, 2]}),
    # no cap: the 12 passages run out
    (10, None, (), {"generated": 12, "passed": 6, "filtered": 6, "kept": 6, "rounds": 2, "stopped": "exhausted",
                    "calls": [10, 2]}),
    # empty replies are rejected, not filtered; nothing passes at first: twice as many next (4); the surplus
    # of the last round (2 of the 3 that pass) is not kept
    (2, 12, ("p0", "p2"), {"generated": 12, "rejected": 2, "passed": 4, "filtered": 6, "kept": 2, "rounds": 3,
                           "stopped": "target", "calls": [2, 4, 6]}),
])
def test_instance_level_generates_until_the_target_is_kept_or_the_cap(target, cap, empty, expected):
    passages = [f"p{i}" for i in range(12)]
    gen = _EchoQueries(empty)
    kept, rep = generate_instance_data(passages, gen, "Find", _EvenPasses(), {p: p for p in passages},
                                       target=target, max_generated=cap, name="pubmed", show_progress=False)
    expected = dict(expected)
    assert gen.calls == expected.pop("calls")
    assert {k: getattr(rep, k) for k in expected} == expected
    assert rep.generated == rep.rejected + rep.duplicates + rep.filtered + rep.passed
    assert [g.pos[0] for g in kept] == [p for p in passages[:rep.generated] if p not in empty and
                                        int(p[1:]) % 2 == 0][:target]
    assert all(g.prompt == "Find" for g in kept) and rep.kept == len(kept)
    d = rep.as_dict()
    assert d["kept_per_generated"] == round(rep.kept / rep.generated, 4) and d["name"] == "pubmed"
    assert f"kept {rep.kept:,} of {rep.generated:,} generated" in rep.summary()


class _Tasks:
    """Three tasks (a repeated and a blank one are dropped); an example drawn with ``ambiguous`` clarity is
    empty (a bad reply); task ``t2`` always answers the same query (duplicates after the first)."""

    def brainstorm_tasks(self, n):
        return ["t0", "t1", "t1", "t2", " "]

    def generate_example(self, task, attributes=None):
        if attributes["clarity"] == "ambiguous":
            return TaskExample(task, "", "p", "n")
        query = "same" if task == "t2" else f"{task} {sorted(attributes.items())}"
        return TaskExample(task, query, f"pos {task}", f"neg {task}")


def test_task_level_counts_tasks_times_examples_and_rejects_duplicates():
    def no_phd(groups):
        return [g for g in groups if "PhD" not in g.query]

    groups, rep = generate_task_data(_Tasks(), tasks=3, examples_per_task=4, max_generated_per_task=20, seed=3,
                                     keep=no_phd)
    per_task = {t: [g for g in groups if g.prompt == t] for t in ("t0", "t1", "t2")}
    assert [len(per_task[t]) for t in ("t0", "t1", "t2")] == [4, 4, 1]  # t2 only ever has one distinct query
    assert all("PhD" not in g.query for g in groups) and len({g.query for g in per_task["t0"]}) == 4
    assert rep.details == {"tasks_asked": 3, "tasks": 3, "examples_per_task": 4}
    assert (rep.target, rep.max_generated, rep.kept, rep.stopped) == (12, 60, 9, "cap")
    assert rep.duplicates > 0 and rep.rejected > 0 and rep.filtered > 0
    assert rep.generated == rep.rejected + rep.duplicates + rep.filtered + rep.passed <= 60
    again, _ = generate_task_data(_Tasks(), tasks=3, examples_per_task=4, max_generated_per_task=20, seed=3,
                                  keep=no_phd)
    assert [g.query for g in again] == [g.query for g in groups]  # the attribute draws are seeded
    fake = FakeTaskGenerator([("gout", "uric acid"), ("asthma", "wheezing")])  # distinct tasks beyond its topics
    assert len(set(fake.brainstorm_tasks(5))) == 5 and len(synthesize_task_groups(fake, 5)) == 5


# ------------------------------------------------------------------------------------------- recipes and plan
def test_sources_schema_and_the_one_source_shorthand():
    from pydantic import ValidationError

    from medadapt.bmretriever.sections import Stage2Section, SyntheticSection, TaskSyntheticSection

    short = SyntheticSection(corpus="pubmed-beir", instruction="meadow", passages=5)
    assert [(s.name, s.corpus, s.instruction, s.passages) for s in short.sources] == [
        ("synthetic", "pubmed-beir", "meadow", 5)]
    assert short.cap(short.sources[0]) == 6  # ceil(5 x 1.2)
    assert SyntheticSection().sources[0].name == "synthetic"
    two = SyntheticSection(sources=[{"name": "a", "passages": 10, "max_generated": 10}, {"name": "b"}],
                           overgenerate=1.5)
    assert [two.cap(s) for s in two.sources] == [10, 150]
    two.top_k = 5  # an assignment is validated; the sources stay
    assert [s.name for s in two.sources] == ["a", "b"] and two.top_k == 5
    with pytest.raises(ValidationError, match="give sources, or passages for one source, not both"):
        SyntheticSection(sources=[{"name": "a"}], passages=3)
    with pytest.raises(ValidationError, match=r"max_generated \(4\) must be >= passages \(5\)"):
        SyntheticSection(sources=[{"name": "a", "passages": 5, "max_generated": 4}])
    with pytest.raises(ValidationError, match="synthetic source names must be unique"):
        SyntheticSection(sources=[{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValidationError, match="stage2 task names must be unique"):
        Stage2Section(tasks=[{"name": "a"}], synthetic={"sources": [{"name": "a"}]})
    assert TaskSyntheticSection(tasks=200, examples_per_task=100).cap_per_task == 120
    with pytest.raises(ValidationError, match="must be >= examples_per_task"):
        TaskSyntheticSection(examples_per_task=3, max_generated_per_task=2)


@pytest.mark.parametrize("name", ["410m", "1b", "2b", "7b"])
def test_paper_recipes_carry_the_papers_synthetic_counts(name):
    from medadapt.recipes import load_recipe

    s2 = load_recipe(ROOT / "recipes" / f"bmretriever-{name}.yaml").stage2
    syn, ts = s2.synthetic, s2.task_synthetic
    assert [s.instruction for s in syn.sources] == ["pubmed", "meadow"]
    assert sum(s.passages for s in syn.sources) == 420_000  # kept (Appendix B.2)
    assert sum(syn.cap(s) for s in syn.sources) == 500_000  # generated
    assert (ts.tasks, ts.examples_per_task, ts.tasks * ts.examples_per_task) == (200, 100, 20_000)
    assert (syn.model, ts.model, ts.filter) == ("gpt-3.5-turbo-1106", "gpt-4-1106-preview", False)


def test_plan_shows_the_synthetic_accounting(tmp_path):
    from typer.testing import CliRunner

    from medadapt.cli import app

    out = tmp_path / "plan.json"
    res = CliRunner().invoke(app, ["plan", str(ROOT / "recipes/bmretriever-7b.yaml"), "--num-gpus", "8",
                                   "--output", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())["data"]
    assert data == [
        "synthetic instance level synthetic-pubmed: keep 210,000 (query, passage) pairs of at most 250,000 queries "
        "generated by gpt-3.5-turbo-1106 (openai) for passages of data/bmretriever/synthetic/pubmed (instruction "
        "'pubmed'); kept when the passage is in intfloat/e5-base-v2's top 3",
        "synthetic instance level synthetic-meadow: keep 210,000 (query, passage) pairs of at most 250,000 queries "
        "generated by gpt-3.5-turbo-1106 (openai) for passages of data/bmretriever/synthetic/meadow-cord19 "
        "(instruction 'meadow'); kept when the passage is in intfloat/e5-base-v2's top 3",
        "synthetic instance level, all sources: keep 420,000 of at most 500,000 generated",
        "synthetic task level synthetic-task: 200 tasks x 100 examples = keep 20,000 of at most 24,000 generated "
        "by gpt-4-1106-preview (openai) (tasks brainstormed 20 per call, Appendix A.1 prompts with sampled "
        "attributes; no filter)",
    ]
    printed = " ".join(res.output.split())
    assert all(f"data: {line}" in printed for line in data)


def test_a_fake_generator_run_records_generated_and_kept(tiny_bert_dir, tiny_beir_dir, tmp_path):
    """Stage II of the tiny recipe with two fake instance-level sources and the fake task level: the run's
    train_log.json holds each source's accounting, and stage II trains on exactly the kept rows."""
    from _helpers import bmretriever_overrides as _tiny_overrides

    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import run_recipe
    from medadapt.tiny import build_tiny_qwen2

    decoder = build_tiny_qwen2(tmp_path / "dec", padding_side="right")
    sources = ("[{name: syn-a, instruction: pubmed, passages: 4, max_generated: 8}, "
               "{name: syn-b, instruction: meadow, passages: 12}]")
    lines = []
    with pytest.warns(MedAdaptWarning) as warned:
        res = run_recipe(ROOT / "recipes" / "bmretriever-tiny.yaml", tmp_path / "run", _tiny_overrides(
            decoder, tiny_beir_dir, tiny_bert_dir) + [
            "stage1.enabled=false",
            f"stage2.synthetic={{generator: fake, noise: 0.5, top_k: 1, sources: {sources}}}",
            "stage2.task_synthetic={tasks: 3, examples_per_task: 2, filter: false}"],
            cache=EmbeddingCache(tmp_path / "c"), show_progress=False, log=lines.append, evaluate=False)
    log = json.loads((tmp_path / "run" / "train_log.json").read_text())
    syn = log["synthetic"]
    assert syn == res.details["synthetic"] and set(syn) == {"syn-a", "syn-b", "synthetic-task"}
    a, b, t = syn["syn-a"], syn["syn-b"], syn["synthetic-task"]
    assert (a["target"], a["max_generated"], b["target"], b["max_generated"]) == (4, 8, 12, 15)
    assert a["kept"] <= 4 and a["generated"] <= 8 and b["generated"] == 12  # the corpus has 12 passages
    assert b["filtered"] > 0 and b["stopped"] == "exhausted"  # half the fake queries are off-topic
    assert (t["generated"], t["kept"], t["details"]["tasks"]) == (6, 6, 3)
    for name, row in syn.items():
        assert row["generated"] == row["rejected"] + row["duplicates"] + row["filtered"] + row["passed"]
        logged = f"synthetic {row['level']} level {name}: kept {row['kept']} of {row['generated']} generated ("
        assert sum(line.startswith(logged) for line in lines) == 1
    assert log["stages"]["stage2"]["rows"] == 12 + a["kept"] + b["kept"] + t["kept"]
    short = sorted(str(w.message).split(":")[0] for w in warned if "fewer than the target" in str(w.message))
    assert f"syn-b: kept {b['kept']}, fewer than the target 12 (exhausted)" in " ".join(str(w.message) for w in warned)
    assert short == [f"synthetic instance level {n}" for n in ("syn-a", "syn-b")
                     if syn[n]["kept"] < syn[n]["target"]]
    assert short  # syn-b cannot reach 12 kept from 12 passages with half its queries off-topic
