"""BMRetriever synthetic data through LLM clients (issue #16 item 1): the OpenAI-compatible client against a
local HTTP server (key only in the request header, never in errors, reprs or saved files), the task-level
generator's JSON handling, the positive-above-negative filter against hand-computed similarities, and both
levels inside a recipe's stage II."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from medadapt.bmretriever.synthetic import (
    LLMQueryGenerator,
    LLMTaskGenerator,
    OpenAICompatibleClient,
    filter_task_groups,
    synthesize_task_groups,
)
from medadapt.data.training import TrainingGroup
from medadapt.errors import MedAdaptError

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
    with pytest.raises(MedAdaptError, match=r"HTTP 401 \(is \$MEDADAPT_TEST_KEY set\?\)") as err:
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
    from test_bmretriever import _tiny_overrides

    from medadapt.bmretriever.instructions import query_prompt
    from medadapt.bmretriever.recipe import stage2_datasets
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
    data, prompts = stage2_datasets(recipe, cache=EmbeddingCache(tmp_path / "c"), show_progress=False,
                                    log=lambda m: None)
    assert set(data) == {"medquad", "synthetic", "synthetic-task"}
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

    from medadapt.bmretriever.schema import SyntheticSection, TaskSyntheticSection

    with pytest.raises(ValidationError, match="generator 'openai' needs a model"):
        TaskSyntheticSection(generator="openai")
    with pytest.raises(ValidationError, match="api_key_env"):
        SyntheticSection(generator="openai", model="m", api_key_env="sk-abc-123")  # a key, not a variable name
    assert TaskSyntheticSection().generator == "fake"


def test_tiny_recipe_runs_task_level_synthetic_data_with_the_filter(tiny_bert_dir, tiny_beir_dir, tmp_path):
    """The fake task generator on the tiny corpus, filtered by the tiny base retriever: what it keeps is
    what the filter keeps when called directly."""
    from test_bmretriever import _tiny_overrides

    from medadapt.bmretriever.recipe import stage2_datasets
    from medadapt.bmretriever.synthetic import FakeTaskGenerator
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.models import load
    from medadapt.recipes import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "bmretriever-tiny.yaml", _tiny_overrides(
        "unused", tiny_beir_dir, tiny_bert_dir) + ["stage2.task_synthetic={tasks: 12}"])
    data, _ = stage2_datasets(recipe, cache=EmbeddingCache(tmp_path / "c"), show_progress=False, log=lambda m: None)
    beir = load_beir(tiny_beir_dir, [])
    gen = FakeTaskGenerator([(beir.corpus[d]["title"] or d, beir.corpus[d]["text"]) for d in beir.doc_ids], seed=42)
    expected = filter_task_groups(synthesize_task_groups(gen, 12), load(str(tiny_bert_dir), device="cpu"))
    assert 0 < len(expected) <= 12
    assert len(data.get("synthetic-task", [])) == len(expected)
