"""Upgrading the query encoder of a built index (medadapt.retrieval.upgrade, `medadapt index upgrade-queries`):
a query-route head or a CARE query tower trained against the index's document encoder takes over its queries;
the documents' vectors are never re-encoded (no document encode call, files byte-identical), the folder is
swapped in as a whole with the upgrade recorded, searching afterwards equals a fresh build with the new model,
and a model with another document side is refused with nothing changed. FAISS folders and Qdrant collections."""

from __future__ import annotations

import contextlib
import hashlib
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import medadapt
from medadapt.cache import EmbeddingCache
from medadapt.cli import app
from medadapt.errors import MedAdaptError
from medadapt.adapters.linear import LinearHeadConfig
from medadapt.moe import MoEConfig
from medadapt.retrieval import IndexCorruptError, IndexMismatchError, Retriever, load_documents
from medadapt.retrieval.storage import MANIFEST, MANIFEST_SUM, read_manifest
from medadapt.retrieval.upgrade import upgrade_qdrant_queries, upgrade_queries

pytestmark = [pytest.mark.usefixtures("_single_thread"), pytest.mark.filterwarnings("ignore")]


# ------------------------------------------------------------------------------------------ models
def _perturb(module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))


def _base(tiny_bert_dir):
    return medadapt.load(str(tiny_bert_dir), device="cpu")


def _head(tiny_bert_dir, folder, config, route, adapter_only: bool, seed: int):
    model = _base(tiny_bert_dir)
    _perturb(model.add_adapter(config, adapter_name="q", route=route), seed)
    if adapter_only:
        medadapt.save_adapter(model, folder)
    else:
        model.save(str(folder))
    return folder


def _care(tiny_bert_dir, folder, same_document: bool):
    from medadapt.care import build_asymmetric_model, prune_layers

    base = _base(tiny_bert_dir)
    pruned = prune_layers(base, 1)  # a one-layer query tower (KALE-style), then "aligned" (moved)
    _perturb(pruned, 4)
    model = (build_asymmetric_model(pruned, base, device="cpu") if same_document
             else build_asymmetric_model(base, pruned, device="cpu"))  # the pruned tower encodes documents
    model.save(str(folder))
    return folder


@pytest.fixture(scope="module")
def models(tiny_bert_dir, tmp_path_factory):
    """Saved models: three with the tiny BERT's document side, three with another one."""
    from conftest import build_tiny_bert

    root = tmp_path_factory.mktemp("upgrade_models")
    return {
        "linear-query-adapter": _head(tiny_bert_dir, root / "lin", LinearHeadConfig(), "query", True, 1),
        "moe-query-folder": _head(tiny_bert_dir, root / "moe", MoEConfig.paper(dim=32, expansion=2), "query",
                                  False, 2),
        "care-pruned-query": _care(tiny_bert_dir, root / "care", True),
        "linear-both-sides": _head(tiny_bert_dir, root / "both", LinearHeadConfig(), None, True, 3),
        "care-pruned-document": _care(tiny_bert_dir, root / "care_doc", False),
        "another-bert": build_tiny_bert(root / "other", seed=3),
    }


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    from conftest import build_tiny_beir

    beir = build_tiny_beir(tmp_path_factory.mktemp("upgrade_beir"))
    return load_documents(beir), [json.loads(line)["text"] for line in (beir / "queries.jsonl").open()]


def _build(docs, model, kind, tmp_path, folder=None):
    r = Retriever.build(docs[0], model=str(model), kind=kind, cache=EmbeddingCache(tmp_path / "cache"),
                        show_progress=False)
    if folder is not None:
        r.save(folder)
    return r


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.name not in (MANIFEST, MANIFEST_SUM)}


def _run(r, queries):
    return [(res.ids, res.scores) for res in r.batch_search(queries, 5)]


@contextlib.contextmanager
def document_encodes():
    """The document encodes made inside the block (``SentenceTransformer.encode_document`` and every
    embedding-cache encode), listed; they still run."""
    from sentence_transformers import SentenceTransformer

    calls: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for owner, name in ((SentenceTransformer, "encode_document"), (EmbeddingCache, "encode")):
            original = getattr(owner, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                calls.append(_name)
                return _original(*args, **kwargs)

            patch.setattr(owner, name, counted)
        yield calls


# ------------------------------------------------------------------------------------------ FAISS folders
@pytest.mark.parametrize("name, kind", [("linear-query-adapter", "dense"), ("moe-query-folder", "hybrid"),
                                        ("care-pruned-query", "dense")])
def test_upgrade_swaps_the_query_encoder_and_leaves_documents_untouched(name, kind, models, docs, tiny_bert_dir,
                                                                       tmp_path):
    idx = tmp_path / "idx"
    _build(docs, tiny_bert_dir, kind, tmp_path, idx)
    before, built = _digests(idx), read_manifest(idx)
    assert built.model.document_fingerprint == built.model.fingerprint  # a one-tower model: its whole self
    with document_encodes() as calls:
        result = upgrade_queries(idx, models[name])
    assert calls == []
    assert result.changed and result.n_docs == len(docs[0])
    assert _digests(idx) == before  # every vector / document file byte-identical
    manifest = read_manifest(idx)  # manifest.sha256 valid, every file's SHA-256 checked
    assert manifest.model.name == str(models[name].resolve()) and manifest.model.source == "local"
    assert manifest.model.document_fingerprint == built.model.document_fingerprint
    assert manifest.files == built.files and manifest.corpus_hash == built.corpus_hash
    [record] = manifest.query_upgrades
    assert record.old == built.model and record.new == manifest.model
    assert record.document_fingerprint == built.model.document_fingerprint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "idx"]  # no temporary folder left


@pytest.mark.parametrize("name, kind", [("linear-query-adapter", "dense"), ("moe-query-folder", "hybrid"),
                                        ("care-pruned-query", "dense")])
def test_upgraded_index_searches_like_a_fresh_build_with_the_new_model(name, kind, models, docs, tiny_bert_dir,
                                                                      tmp_path):
    queries = docs[1]
    idx = tmp_path / "idx"
    base = _build(docs, tiny_bert_dir, kind, tmp_path, idx)
    upgrade_queries(idx, models[name])
    upgraded = Retriever.load(idx)  # reloads the recorded (new) model
    fresh = _build(docs, models[name], kind, tmp_path)
    np.testing.assert_array_equal(upgraded.dense.reconstruct_all(), fresh.dense.reconstruct_all())  # same docs
    got, want, old = _run(upgraded, queries), _run(fresh, queries), _run(base, queries)
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-5, atol=1e-6)
    q_new, q_old = upgraded.encode_queries(queries), base.encode_queries(queries)
    assert np.abs(q_new - q_old).max() > 1e-2  # the new query encoder is the one in use
    assert got != old


@pytest.mark.parametrize("name, reason", [("linear-both-sides", "document encoder"),
                                          ("care-pruned-document", "document encoder"),
                                          ("another-bert", "document encoder")])
def test_another_document_encoder_is_refused_and_nothing_changes(name, reason, models, docs, tiny_bert_dir,
                                                                 tmp_path):
    idx = tmp_path / "idx"
    _build(docs, tiny_bert_dir, "dense", tmp_path, idx)
    before = _files(idx)
    with document_encodes() as calls, pytest.raises(IndexMismatchError, match=reason) as err:
        upgrade_queries(idx, models[name])
    assert "nothing was changed" in str(err.value) and "rebuild the index" in str(err.value)
    assert _files(idx) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "idx"]
    assert calls == []


def test_a_bm25_index_has_no_query_encoder_to_upgrade(models, docs, tmp_path):
    idx = tmp_path / "idx"
    _build(docs, None, "lexical", tmp_path, idx)
    before = _files(idx)
    with pytest.raises(MedAdaptError, match="no query encoder to upgrade"):
        upgrade_queries(idx, models["linear-query-adapter"])
    assert _files(idx) == before


def test_same_model_changes_nothing_and_upgrades_chain(models, docs, tiny_bert_dir, tmp_path):
    idx = tmp_path / "idx"
    _build(docs, tiny_bert_dir, "dense", tmp_path, idx)
    before = _files(idx)
    result = upgrade_queries(idx, tiny_bert_dir)
    assert not result.changed and _files(idx) == before
    first = upgrade_queries(idx, models["linear-query-adapter"])
    second = upgrade_queries(idx, models["care-pruned-query"])
    assert second.old == first.new
    manifest = read_manifest(idx)
    assert [u.new.name for u in manifest.query_upgrades] == [first.new.name, second.new.name]


def test_an_index_built_before_document_fingerprints_were_recorded(models, docs, tiny_bert_dir, tmp_path):
    """Older manifests lack model.document_fingerprint: the recorded model is reloaded to tell."""
    idx = tmp_path / "idx"
    _build(docs, tiny_bert_dir, "dense", tmp_path, idx)
    data = json.loads((idx / MANIFEST).read_text())
    expected = data["model"].pop("document_fingerprint")
    raw = (json.dumps(data, indent=2) + "\n").encode()
    (idx / MANIFEST).write_bytes(raw)
    (idx / MANIFEST_SUM).write_text(f"{hashlib.sha256(raw).hexdigest()}  {MANIFEST}\n")
    result = upgrade_queries(idx, models["care-pruned-query"])
    assert result.changed and result.document_fingerprint == expected
    with pytest.raises(IndexMismatchError, match="document encoder"):
        upgrade_queries(idx, models["another-bert"])


def test_a_damaged_index_is_refused_before_the_swap(models, docs, tiny_bert_dir, tmp_path):
    idx = tmp_path / "idx"
    _build(docs, tiny_bert_dir, "dense", tmp_path, idx)
    raw = bytearray((idx / "dense.faiss").read_bytes())
    raw[-1] ^= 0xFF  # same size, one byte flipped
    (idx / "dense.faiss").write_bytes(bytes(raw))
    before = _files(idx)
    with pytest.raises(IndexCorruptError, match="dense.faiss: differs from the manifest"):
        upgrade_queries(idx, models["linear-query-adapter"])
    assert _files(idx) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "idx"]


def test_an_index_rebuilt_during_the_upgrade_is_upgraded_as_rebuilt(models, docs, tiny_bert_dir, tmp_path,
                                                                    monkeypatch):
    """A rebuild swapped in while the files are carried: the carried mix is dropped, the upgrade starts again
    on the rebuilt folder (whose files it then keeps byte for byte)."""
    from medadapt.retrieval import upgrade as upgrade_mod

    idx = tmp_path / "idx"
    _build(docs, tiny_bert_dir, "dense", tmp_path, idx)
    rebuilt = _build(docs, tiny_bert_dir, "hybrid", tmp_path)
    carry, calls = upgrade_mod._carry, []

    def carry_then_rebuild(folder, tmp):
        carry(folder, tmp)
        if not calls:
            rebuilt.save(idx)
        calls.append(tmp)

    monkeypatch.setattr(upgrade_mod, "_carry", carry_then_rebuild)
    result = upgrade_queries(idx, models["linear-query-adapter"])
    assert len(calls) == 2 and result.changed
    manifest = read_manifest(idx)
    assert manifest.kind == "hybrid" and len(manifest.query_upgrades) == 1
    assert manifest.files == rebuilt.manifest.files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "idx"]  # the first attempt's folder is gone


# ------------------------------------------------------------------------------------------ CLI
def test_cli_upgrade_queries(models, docs, tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    idx = tmp_path / "idx"
    _build(docs, tiny_bert_dir, "dense", tmp_path, idx)
    before = _files(idx)
    runner = CliRunner()
    res = runner.invoke(app, ["index", "upgrade-queries", "--index", str(idx), "--model",
                              str(models["linear-both-sides"]), "-q"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "document encoder" in lines[0], res.output
    assert _files(idx) == before
    res = runner.invoke(app, ["index", "upgrade-queries", "--index", str(idx), "--model",
                              str(models["linear-query-adapter"]), "-q"])
    assert res.exit_code == 0, res.output
    assert "upgraded the query encoder" in res.stdout and "documents untouched" in res.stdout
    assert len(res.stdout.splitlines()) == 1
    assert read_manifest(idx).model.name == str(models["linear-query-adapter"].resolve())
    for args, message in [
        (["--model", str(models["linear-query-adapter"])], "give --index FOLDER or --qdrant"),
        (["--index", str(tmp_path / "none"), "--model", str(models["linear-query-adapter"])], "not found"),
        (["--index", str(idx), "--collection", "c", "--model", str(models["linear-query-adapter"])], "--qdrant"),
    ]:
        res = runner.invoke(app, ["index", "upgrade-queries", *args, "-q"])
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.exit_code == 1 and len(lines) == 1 and message in lines[0], (args, res.output)


def test_cli_index_without_subcommand_still_requires_corpus(docs, tmp_path, monkeypatch):
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    res = CliRunner().invoke(app, ["index", "--out", str(tmp_path / "x"), "--kind", "lexical"])
    assert res.exit_code == 2 and "Missing option '--corpus'" in res.output


# ------------------------------------------------------------------------------------------ Qdrant
def _points(client, collection) -> str:
    points, offset = [], None
    while True:
        batch, offset = client.scroll(collection, limit=256, offset=offset, with_vectors=True, with_payload=True)
        points += batch
        if offset is None:
            break
    rows = sorted((int(p.id), p.vector, p.payload) for p in points)
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def test_qdrant_collection_upgrade(models, docs, tiny_bert_dir, tmp_path, monkeypatch):
    from qdrant_client import QdrantClient

    from medadapt.retrieval.vectordb import QdrantRetriever, export_to_qdrant

    client = QdrantClient(":memory:")
    export_to_qdrant(client, "c", docs[0], str(tiny_bert_dir), cache=EmbeddingCache(tmp_path / "cache"))
    vectors, meta = _points(client, "c"), client.get_collection("c").config.metadata
    with pytest.raises(IndexMismatchError, match="document encoder"):
        upgrade_qdrant_queries(client, "c", models["linear-both-sides"])
    assert client.get_collection("c").config.metadata == meta
    result = upgrade_qdrant_queries(client, "c", models["care-pruned-query"])
    assert result.changed and _points(client, "c") == vectors
    served = QdrantRetriever(client, "c")
    assert served.manifest.model.name == str(models["care-pruned-query"].resolve())
    assert [u.old.fingerprint for u in served.manifest.query_upgrades] == [meta["medadapt"]["model"]["fingerprint"]]
    fresh = _build(docs, models["care-pruned-query"], "dense", tmp_path)
    got, want = _run(served, docs[1]), _run(fresh, docs[1])
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-5, atol=1e-6)


def test_cli_upgrades_an_embedded_qdrant_database(models, docs, tiny_bert_dir, tmp_path, monkeypatch):
    from qdrant_client import QdrantClient

    from medadapt.retrieval.vectordb import export_to_qdrant

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    client = QdrantClient(path=str(tmp_path / "db"))
    export_to_qdrant(client, "c", docs[0], str(tiny_bert_dir))
    client.close()
    client = QdrantClient(path=str(tmp_path / "db"))  # as stored (the embedded mode re-normalises on reading)
    vectors = _points(client, "c")
    client.close()
    runner = CliRunner()
    res = runner.invoke(app, ["index", "upgrade-queries", "--qdrant", str(tmp_path / "db"), "--collection", "c",
                              "--model", str(models["moe-query-folder"]), "-q"])
    assert res.exit_code == 0 and "upgraded the query encoder of Qdrant collection 'c'" in res.stdout, res.output
    res = runner.invoke(app, ["index", "upgrade-queries", "--qdrant", str(tmp_path / "nodb"), "--collection", "c",
                              "--model", str(models["moe-query-folder"]), "-q"])
    assert res.exit_code == 1 and res.stderr.startswith("error: Qdrant database folder not found")
    assert not (tmp_path / "nodb").exists()
    client = QdrantClient(path=str(tmp_path / "db"))
    try:
        meta = client.get_collection("c").config.metadata["medadapt"]
        assert meta["model"]["name"] == str(models["moe-query-folder"].resolve())
        assert _points(client, "c") == vectors
    finally:
        client.close()
