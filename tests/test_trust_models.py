"""Trust and robustness of model folders, index folders, output paths, devices, FAISS factories and the
OpenAI-compatible backend (issue #17 re-audit, sections 1, 5, 6, 7, 8).

Every case asserts what happens, not that "something" was raised: a marker file that code shipped in a
model folder would write must not exist, CLI runs end with exit code 1 and exactly one ``error:`` line,
and nothing is written."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

import medadapt
from conftest import run_cli, run_cli_cases
from medadapt.errors import ConfigError, MedAdaptError, ModelLoadError
from medadapt.retrieval import Retriever, load_documents
from medadapt.retrieval.errors import IndexCorruptError, IndexMismatchError

pytestmark = pytest.mark.usefixtures("_single_thread")


# ---------------------------------------------------------------------------------------------- helpers
def _headed_model(tiny_bert_dir, folder: Path) -> Path:
    """The tiny model plus a medadapt head (an ``AdapterStack`` in ``modules.json``), saved to ``folder``."""
    from sentence_transformers import SentenceTransformer

    from medadapt.moe.config import MoEConfig

    model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    model.add_adapter(MoEConfig.single_expert(32), adapter_name="moe")
    model.save(str(folder))
    assert any(e["type"].startswith("medadapt.") for e in json.loads((folder / "modules.json").read_text()))
    return folder


def _plant_code(folder: Path, json_name: str, marker: Path) -> None:
    """Ship ``tokenization_evil.py`` (writes ``marker`` when imported) and point an ``auto_map`` in
    ``folder/json_name`` at it, as a hostile model folder would."""
    (folder / "tokenization_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class EvilTok(PreTrainedTokenizerFast):\n    pass\n"
    )
    path = folder / json_name
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["auto_map"] = {"AutoTokenizer": [None, "tokenization_evil.EvilTok"],
                        "AutoProcessor": "tokenization_evil.EvilTok"}
    if json_name == "tokenizer_config.json":
        data["tokenizer_class"] = "EvilTok"
    path.write_text(json.dumps(data))


def _cli(args: list[str], tmp_path: Path, env_extra: dict | None = None, cwd: Path | None = None):
    """``medadapt ARGS`` through the CLI's entry point in this process (:func:`conftest.run_cli`); the
    fuzzing test below runs one case in a real process."""
    env = {**os.environ, "MEDADAPT_CACHE": str(tmp_path / "cli-cache"), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", **(env_extra or {})}
    return run_cli(args, env, cwd)


def _one_error_line(proc, *needles: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:"), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ------------------------------------------------------------------------- 1. code shipped in a folder
@pytest.mark.parametrize("json_name", ["tokenizer_config.json", "processor_config.json",
                                       "preprocessor_config.json", "config.json", "0_Transformer/config.json"])
def test_auto_map_in_any_json_is_refused_before_anything_runs(tiny_bert_dir, tmp_path, json_name):
    folder = _headed_model(tiny_bert_dir, tmp_path / "evil")
    marker = tmp_path / "PWNED"
    _plant_code(folder, json_name, marker)
    with pytest.raises(ModelLoadError) as err:
        medadapt.load(str(folder), device="cpu")
    message = str(err.value)
    assert "does not run code from model folders" in message and f"auto_map in {json_name}" in message
    assert "\n" not in message
    assert not marker.exists()
    # trust_remote_code=False from the caller: no implicit trust, nothing runs either
    with pytest.raises(ModelLoadError):
        medadapt.load(str(folder), device="cpu", trust_remote_code=False)
    assert not marker.exists()


def test_medadapt_heads_load_without_trust_remote_code(tiny_bert_dir, tmp_path):
    """The medadapt classes come from the installed package: sentence-transformers never gets the flag, so
    Hugging Face never honours an ``auto_map`` nor imports a ``*.py`` of the folder."""
    from sentence_transformers import SentenceTransformer

    folder = _headed_model(tiny_bert_dir, tmp_path / "headed")
    model = medadapt.load(str(folder), device="cpu")
    assert model.trust_remote_code is False
    assert any(type(m).__module__ == "medadapt.adapters.stack" for m in model)
    ref = SentenceTransformer(str(folder), device="cpu", trust_remote_code=True)
    texts = ["gout toe pain", "asthma inhaler"]
    np.testing.assert_allclose(model.encode(texts), ref.encode(texts), atol=1e-6)
    # a name under medadapt. that is no medadapt module class is refused, not looked up in the folder
    (folder / "medadapt.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'w').write('ran')\nclass Evil: pass\n")
    modules = json.loads((folder / "modules.json").read_text())
    modules[-1]["type"] = "medadapt.Evil"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match="'medadapt.Evil', which is not a module class"):
        medadapt.load(str(folder), device="cpu")
    assert not (tmp_path / "PWNED").exists()


def test_older_sentence_transformers_fallback_keeps_the_checks(tiny_bert_dir, tmp_path, monkeypatch):
    """Without ``_load_with_module_classes`` (older sentence-transformers) the flag is set for medadapt
    folders, after refusing what it would also let run: ``file.Class`` references Hugging Face would load
    from the folder, non-torch ``Dense`` activations, ``auto_map``."""
    from sentence_transformers import SentenceTransformer

    owner = next(c for c in SentenceTransformer.__mro__ if "_load_with_module_classes" in vars(c))
    monkeypatch.delattr(owner, "_load_with_module_classes")
    assert not hasattr(SentenceTransformer, "_load_with_module_classes")
    folder = _headed_model(tiny_bert_dir, tmp_path / "headed")
    assert medadapt.load(str(folder), device="cpu").trust_remote_code is True
    marker = tmp_path / "PWNED"
    (folder / "medadapt.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass Evil: pass\n")
    modules = json.loads((folder / "modules.json").read_text())
    original = modules[-1]["type"]
    modules[-1]["type"] = "medadapt.Evil"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match="'medadapt.Evil'.*does not run code from model folders"):
        medadapt.load(str(folder), device="cpu")
    modules[-1]["type"] = original
    (folder / "modules.json").write_text(json.dumps(modules))
    normalize = folder / modules[-1]["path"] / "config.json"
    normalize.write_text(json.dumps({**json.loads(normalize.read_text()), "activation_function": "os.getpid"}))
    with pytest.raises(ModelLoadError, match="activation function 'os.getpid'"):
        medadapt.load(str(folder), device="cpu")
    assert not marker.exists()


def test_shipped_code_is_refused_through_an_index_and_the_cli(tiny_bert_dir, tiny_beir_dir, tmp_path):
    folder = _headed_model(tiny_bert_dir, tmp_path / "model")
    docs = load_documents(tiny_beir_dir)
    Retriever.build(docs, model=str(folder), kind="dense", show_progress=False).save(tmp_path / "idx")
    marker = tmp_path / "PWNED"
    _plant_code(folder, "tokenizer_config.json", marker)  # the model folder the index names turns hostile
    with pytest.raises(ModelLoadError, match="does not run code from model folders"):
        Retriever.load(tmp_path / "idx")
    assert not marker.exists()
    proc = _cli(["search", "--index", str(tmp_path / "idx"), "gout"], tmp_path)
    _one_error_line(proc, "does not run code from model folders", "tokenizer_config.json")
    assert not marker.exists()


# ------------------------------------------------------------------------------- 2. index manifests
def test_index_finds_its_local_model_from_another_working_directory(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                     monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(tiny_bert_dir, work / "model_rel")
    docs = load_documents(tiny_beir_dir)
    monkeypatch.chdir(work)
    built = Retriever.build(docs, model="model_rel", kind="dense", show_progress=False)
    built.save(work / "idx")
    info = json.loads((work / "idx" / "manifest.json").read_text())["model"]
    assert info["name"] == str((work / "model_rel").resolve()) and info["source"] == "local"
    want = built.search("gout uric acid", 3)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    got = Retriever.load(work / "idx").search("gout uric acid", 3)
    assert got.ids == want.ids
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5)
    # the CLI records './model_rel' typed in `work` as the same absolute folder
    proc = _cli(["index", "--corpus", str(tiny_beir_dir), "--out", "idx_cli", "--model", "./model_rel", "-q"],
                tmp_path, cwd=work)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cli_info = json.loads((work / "idx_cli" / "manifest.json").read_text())["model"]
    assert cli_info["name"] == info["name"] and cli_info["source"] == "local"
    # a recorded local folder that is gone is an index error, never a hub lookup of that name
    shutil.move(str(work / "model_rel"), str(tmp_path / "moved"))
    with pytest.raises(IndexMismatchError, match="which is gone") as err:
        Retriever.load(work / "idx")
    assert "hub" not in str(err.value)


def test_tampered_manifest_is_refused_before_any_model_is_loaded(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                 monkeypatch):
    import medadapt.models

    docs = load_documents(tiny_beir_dir)
    r = Retriever.build(docs, model=str(tiny_bert_dir), kind="hybrid", show_progress=False)
    path = r.save(tmp_path / "idx")
    assert (path / "manifest.sha256").read_text().split()[1] == "manifest.json"
    Retriever.load(path)  # intact: loads

    loads = []
    real_load = medadapt.models.load
    monkeypatch.setattr(medadapt.models, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    raw = bytearray((path / "manifest.json").read_bytes())
    at = raw.index(b'"corpus_hash": "') + len(b'"corpus_hash": "')
    raw[at] = ord("0") if raw[at] != ord("0") else ord("1")  # one byte changed, still valid JSON
    (path / "manifest.json").write_bytes(bytes(raw))
    with pytest.raises(IndexCorruptError, match="checksum differs from manifest.sha256"):
        Retriever.load(path)
    assert loads == []  # refused before the model was touched
    for flip in (b'"format": 3', b'"kind": "hybrid"'):  # a changed format or kind is a changed byte too
        assert flip in (path / "manifest.json").read_bytes()

    # format 3 without its checksum file: refused; an older index (format 2, no checksum) still loads
    old = tmp_path / "old"
    shutil.copytree(path, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["corpus_hash"] = r.manifest.corpus_hash
    (old / "manifest.json").write_text(json.dumps(manifest))
    (old / "manifest.sha256").unlink()
    with pytest.raises(IndexCorruptError, match="manifest.sha256 is missing"):
        Retriever.load(old)
    manifest["format"] = 2
    manifest["model"].pop("source")
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert Retriever.load(old).search("gout uric acid", 3).ids == r.search("gout uric acid", 3).ids


def test_index_replaced_while_loading_is_read_again(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    """A swap between reading the manifest and reading the files: the old manifest is never paired with the
    new files; the load starts over and returns the new version whole."""
    from medadapt.retrieval import dense as dense_mod

    docs = load_documents(tiny_beir_dir)
    first = Retriever.build(docs, model=str(tiny_bert_dir), kind="dense", show_progress=False)
    path = first.save(tmp_path / "idx")
    from medadapt.retrieval.docstore import Documents

    half = Documents(ids=docs.ids[:5], titles=docs.titles[:5], texts=docs.texts[:5])
    second = Retriever.build(half, model=str(tiny_bert_dir), kind="dense", show_progress=False)
    real = dense_mod.DenseIndex.load.__func__
    calls = []

    def swapping_load(cls, folder, *a, **k):
        calls.append(folder)
        if len(calls) == 1:
            second.save(path)  # a concurrent rebuild lands mid-load
        return real(cls, folder, *a, **k)

    monkeypatch.setattr(dense_mod.DenseIndex, "load", classmethod(swapping_load))
    loaded = Retriever.load(path)
    assert len(calls) == 2 and len(loaded) == 5 and loaded.manifest.n_docs == 5 and loaded.dense.ntotal == 5

    def always_swapping(cls, folder, *a, **k):  # never stable: a clear error after 3 attempts
        (second if len(calls) % 2 else first).save(path)  # the folder holds `second` now: first is a change
        calls.append(folder)
        return real(cls, folder, *a, **k)

    monkeypatch.setattr(dense_mod.DenseIndex, "load", classmethod(always_swapping))
    calls.clear()
    with pytest.raises(IndexCorruptError, match="the index changed while being read"):
        Retriever.load(path)
    assert len(calls) == 3


# ---------------------------------------------------------------------------------- 3. head widths
def test_head_narrower_than_the_backbone_is_refused_at_load(tiny_bert_dir, tmp_path):
    from transformers import BertConfig, BertModel

    folder = _headed_model(tiny_bert_dir, tmp_path / "full")
    config = json.loads((folder / "config.json").read_text())
    wide = BertConfig(**{**config, "hidden_size": 48, "num_attention_heads": 2, "intermediate_size": 64})
    BertModel(wide).save_pretrained(tmp_path / "bert48")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tmp_path / "bert48" / name, folder / name)
    pooling = next(folder.glob("*_Pooling")) / "config.json"
    pc = json.loads(pooling.read_text())
    pc["word_embedding_dimension"] = 48
    pooling.write_text(json.dumps(pc))
    with pytest.raises(ModelLoadError) as err:
        medadapt.load(str(folder), device="cpu")
    message = str(err.value)
    assert "32-d" in message and "48-d" in message and "moe" in message and "\n" not in message
    pc["embedding_dimension"] = 48  # a pooling config that tells the truth: refused the same way
    pooling.write_text(json.dumps(pc))
    with pytest.raises(ModelLoadError, match="heads: moe.* is 32-d but the embedding before it is 48-d"):
        medadapt.load(str(folder), device="cpu")


# ------------------------------------------------------------------------- 4-7. direct API checks
def test_device_check(monkeypatch):
    import torch

    from medadapt.models import check_device

    check_device(None)
    check_device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        check_device("cuda")
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        check_device("cuda:1")
    with pytest.raises(ModelLoadError, match="unknown device 'gpu0'"):
        check_device("gpu0")
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        medadapt.load("org/any-model", device="cuda")  # before any lookup


def test_atomic_writes_refuse_folders_unwritable_paths_and_nan(tmp_path):
    from medadapt.io import atomic_open, atomic_write_json

    (tmp_path / "out").mkdir()
    with pytest.raises(MedAdaptError, match="is an existing folder"):
        atomic_write_json(tmp_path / "out", {"a": 1})
    assert list((tmp_path / "out").iterdir()) == [] and [p.name for p in tmp_path.iterdir()] == ["out"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(MedAdaptError, match=r"cannot write .*file/x\.json: "):
        with atomic_open(tmp_path / "file" / "x.json") as f:
            f.write("{}")
    with pytest.raises(MedAdaptError, match=r"cannot write .*m\.json: .*NaN"):
        atomic_write_json(tmp_path / "m.json", {"pearson": float("nan")})
    with pytest.raises(MedAdaptError, match="m.json"):
        atomic_write_json(tmp_path / "m.json", {"x": float("inf")})
    assert not (tmp_path / "m.json").exists() and not list(tmp_path.glob(".m.json.*"))
    atomic_write_json(tmp_path / "ok.json", {"a": 1.5})
    assert json.loads((tmp_path / "ok.json").read_text()) == {"a": 1.5}


def test_ivf_with_more_lists_than_documents_is_refused_before_encoding():
    from medadapt.retrieval.config import DenseConfig
    from medadapt.retrieval.dense import DenseIndex

    vecs = np.random.default_rng(0).standard_normal((200, 32)).astype(np.float32)
    with pytest.raises(MedAdaptError, match=r"nlist=4096 .* only 200 documents.*IVF5,Flat"):
        DenseIndex.build(vecs, DenseConfig(factory="IVF4096,Flat"))
    embedded = []
    with pytest.raises(MedAdaptError, match="nlist=4096"):
        DenseIndex.build_chunked(200, lambda pos: embedded.append(pos) or vecs[pos], 32,
                                 DenseConfig(factory="IVF4096,Flat"), show_progress=False)
    assert embedded == []  # refused before encoding anything
    with pytest.raises(MedAdaptError, match=r"FAISS cannot train 'IVF4,PQ4' .*\(Number of training points"):
        DenseIndex.build(vecs, DenseConfig(factory="IVF4,PQ4"))  # PQ needs 256 points: faiss's message, one line
    ok = DenseIndex.build(vecs, DenseConfig(factory="IVF4,Flat"))
    assert ok.ntotal == 200


class _Recording(http.server.BaseHTTPRequestHandler):
    seen: list = []
    redirect_to = ""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Recording.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/v1/"):
            self.send_response(302)
            self.send_header("Location", _Recording.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            body = json.dumps({"choices": [{"message": {"content": "ok"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args):
        pass


def test_api_key_goes_only_to_the_base_url(monkeypatch):
    from medadapt.curation import OpenAIChat

    posted = []

    def post(*a):
        posted.append(a)
        return {"choices": [{"message": {"content": "ok"}}]}

    monkeypatch.setenv("FAKE_MEDADAPT_KEY", "sk-fake")
    with pytest.raises(ConfigError, match="refusing to send the API key over plain http to evil.example.com"):
        OpenAIChat("m", "http://evil.example.com/v1", api_key_env="FAKE_MEDADAPT_KEY", post=post)
    assert posted == []
    for url in ("http://localhost:8000/v1", "http://127.0.0.1:8000/v1", "http://[::1]:8000/v1",
                "https://api.example.com/v1"):
        OpenAIChat("m", url, api_key_env="FAKE_MEDADAPT_KEY", post=post)
    OpenAIChat("m", "http://evil.example.com/v1", api_key_env="FAKE_MEDADAPT_KEY", post=post,
               allow_insecure_http=True)("hi")
    assert posted and posted[-1][2]["Authorization"] == "Bearer sk-fake"
    OpenAIChat("m", "http://evil.example.com/v1", api_key_env="FAKE_MEDADAPT_UNSET_KEY", post=post)  # no key
    with pytest.raises(ConfigError, match="not an http"):
        OpenAIChat("m", "file:///etc/passwd", api_key_env="FAKE_MEDADAPT_KEY", post=post)

    # a redirect is never followed with the key (a local server on two ports stands in for two hosts)
    servers = [http.server.HTTPServer(("127.0.0.1", 0), _Recording) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        _Recording.seen = []
        _Recording.redirect_to = f"http://127.0.0.1:{servers[1].server_port}/elsewhere"
        chat = OpenAIChat("m", f"http://127.0.0.1:{servers[0].server_port}/v1", api_key_env="FAKE_MEDADAPT_KEY",
                          max_retries=0)
        with pytest.raises(MedAdaptError, match="a redirect to .*/elsewhere; medadapt does not follow"):
            chat("hi")
        assert _Recording.seen == [("/v1/chat/completions", "Bearer sk-fake")]  # nothing reached the target
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


# --------------------------------------------------------------------------------------------- CLI
def test_cli_bad_device_output_factory_and_http_give_one_line_and_write_nothing(tiny_bert_dir, tiny_beir_dir,
                                                                                tmp_path):
    import torch

    Retriever.build(load_documents(tiny_beir_dir), model=str(tiny_bert_dir), kind="dense",
                    show_progress=False).save(tmp_path / "idx")
    (tmp_path / "queries.tsv").write_text("q1\tgout uric acid\n")
    (tmp_path / "outdir").mkdir()
    cases = []
    if not torch.cuda.is_available():
        cases += [
            (["eval", "--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--device", "cuda",
              "--output", str(tmp_path / "m.json")], "CUDA is not available", "m.json"),
            (["index", "--corpus", str(tiny_beir_dir), "--out", str(tmp_path / "idx_cuda"), "--model",
              str(tiny_bert_dir), "--device", "cuda"], "CUDA is not available", "idx_cuda"),
            (["search", "--index", str(tmp_path / "idx"), "--device", "cuda", "gout"], "CUDA is not available",
             None),
        ]
    cases += [
        (["eval", "--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--device", "tpu9"],
         "device 'tpu9'", None),
        (["eval", "--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--output", str(tmp_path / "outdir")],
         "is an existing folder", None),
        (["eval", "--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--output",
          "/proc/version/m.json"], "cannot write --output /proc/version/m.json", None),
        (["search", "--index", str(tmp_path / "idx"), "--queries", str(tmp_path / "queries.tsv"), "--output",
          str(tmp_path / "outdir")], "is an existing folder", None),
        (["index", "--corpus", str(tiny_beir_dir), "--out", str(tmp_path / "idx_ivf"), "--model", str(tiny_bert_dir),
          "--factory", "IVF4096,Flat"], "nlist=4096", "idx_ivf"),
    ]
    env = {**os.environ, "MEDADAPT_CACHE": str(tmp_path / "cli-cache"), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    for (args, message, out), proc in zip(cases, run_cli_cases([[*a, "-q"] for a, _, _ in cases], env,
                                                               processes=0)):
        _one_error_line(proc, message)
        if out is not None:
            assert not (tmp_path / out).exists(), args
    assert list((tmp_path / "outdir").iterdir()) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers


def test_cli_refuses_api_key_over_plain_http_before_any_request(tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"query": "gout", "passages": ["uric acid", "asthma"]}) + "\n")
    judge = "openai:m@http://evil.example.com/v1"
    env = {"FAKE_MEDADAPT_KEY": "sk-fake", "http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "no_proxy": "", "NO_PROXY": ""}  # a request would fail on the dead proxy, not reach the network
    base = ["data", "label", "--input", str(items), "--output", str(tmp_path / "labels.jsonl"), "--judge", judge,
            "--judge", judge, "--api-key-env", "FAKE_MEDADAPT_KEY"]
    proc = _cli(base, tmp_path, env)
    _one_error_line(proc, "refusing to send the API key over plain http to evil.example.com", "--allow-insecure-http")
    assert not (tmp_path / "labels.jsonl").exists()
    # with the opt-in the key would be sent: the request is made (and fails on the dead proxy)
    proc = _cli([*base, "--allow-insecure-http"], tmp_path, env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "refusing" not in proc.stderr
    assert not (tmp_path / "labels.jsonl").exists()


def test_cli_outputs_devices_and_values_found_bad_are_refused_before_any_work(tiny_bert_dir, tiny_beir_dir,
                                                                             tmp_path):
    """What a fuzzing pass of the CLI found: outputs under a file or on /proc, a cache folder that is a
    file, an unknown training device, a boolean batch size, a NaN GPU size, a bad accelerate config, a
    non-index --out, an empty query, an output that is a symlink or a device node. Each is one error line
    before any work, and nothing is written (an existing output file stays as it was)."""
    import stat

    Retriever.build(load_documents(tiny_beir_dir), model=str(tiny_bert_dir), kind="lexical",
                    show_progress=False).save(tmp_path / "idx")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "notindex").mkdir()
    (tmp_path / "notindex" / "keep.txt").write_text("keep")
    (tmp_path / "keep.jsonl").write_text("KEEP\n")
    (tmp_path / "acc.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: abc\n")
    (tmp_path / "items.jsonl").write_text("".join(json.dumps({"_id": str(i), "text": f"gout {i}"}) + "\n"
                                                  for i in range(4)))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    recipe = str(Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-tiny.yaml")
    base = ["--set", f"model.backbone={tiny_bert_dir}", "--set", f"data.path={tiny_beir_dir}"]
    cases = [
        (["train", recipe, "--output", str(tmp_path / "afile" / "run"), *base], "afile", "afile/run"),
        (["train", recipe, "--output", "/proc/medadapt-run", *base], "/proc", None),
        (["train", recipe, "--output", str(tmp_path / "r1"), *base, "--set", "training.device=tpu"],
         "training.device", "r1"),
        (["train", recipe, "--output", str(tmp_path / "r2"), *base, "--set", "training.batch_size=true"],
         "batch_size must be a number, not true", "r2"),
        (["encode", "--corpus", str(tiny_beir_dir), "--model", str(tiny_bert_dir), "--cache-dir",
          str(tmp_path / "afile")], "afile", None),
        (["plan", recipe, "--gpu-memory", "nan"], "--gpu-memory must be a finite number", None),
        (["plan", recipe, "--accelerate-config", str(tmp_path / "acc.yaml")], "num_processes must be a whole number",
         None),
        (["index", "--corpus", str(tiny_beir_dir), "--model", str(tiny_bert_dir), "--out", str(tmp_path / "notindex"),
          "--cache-dir", str(tmp_path / "c-index")], "is not a medadapt index", None),
        (["search", "--index", str(tmp_path / "idx"), "   "], "the query is empty", None),
        (["data", "dedup", "--input", str(tmp_path / "items.jsonl"), "--model", str(tiny_bert_dir), "--output",
          str(tmp_path / "keep.jsonl"), "--report", str(tmp_path / "afile" / "r.json")], "afile", None),
        (["eval", "--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir), "--output", str(fifo)],
         "not a regular file", None),
    ]
    env = {**os.environ, "MEDADAPT_CACHE": str(tmp_path / "cli-cache"), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    quiet = [[*a, *([] if a[0] == "plan" else ["-q"])] for a, _, _ in cases]  # plan prints no bars
    # the first case in a real `python -m medadapt` process (this file's one), the others in this process
    for (args, message, out), proc in zip(cases, run_cli_cases(quiet, env, processes=1)):
        _one_error_line(proc, message)
        if out is not None:
            assert not (tmp_path / out).exists(), args
    assert (tmp_path / "keep.jsonl").read_text() == "KEEP\n"  # dedup checked --report before writing --output
    assert sorted(p.name for p in (tmp_path / "notindex").iterdir()) == ["keep.txt"]
    assert not (tmp_path / "c-index").exists()  # refused before the corpus was encoded
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # the node was not replaced by a file
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r1.checkpoints").exists()


def test_an_output_that_is_a_symlink_is_written_through(tmp_path):
    """Every medadapt file write goes through ``atomic_open``: a symlink output keeps the link and updates its
    target (renaming over the link would leave the target as it was)."""
    from medadapt.io import atomic_write_json

    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "target.json")
    atomic_write_json(link, {"ndcg@10": 0.5})
    assert link.is_symlink() and json.loads((tmp_path / "target.json").read_text()) == {"ndcg@10": 0.5}
