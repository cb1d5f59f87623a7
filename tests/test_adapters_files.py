"""Adapter folders as outputs (medadapt.adapters.files.save_adapter): the output policy of medadapt.io, a
symlink written through, and several threads saving one folder. Nothing a user had is lost: refused saves
leave every pre-existing file byte-identical and nothing hidden beside them. Also the base a folder records
(a plain ``SentenceTransformer(path)`` included) and what sentence-transformers / PEFT say without medadapt."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

import medadapt
from medadapt.adapters.files import ADAPTER_CONFIG, read_adapter_config, save_adapter
from medadapt.errors import ConfigError
from medadapt.moe import MoEConfig  # importing a medadapt head config extends SentenceTransformer.add_adapter

pytestmark = pytest.mark.usefixtures("_single_thread")

TEXTS = ["symptoms of gout", "asthma treatment with an inhaler"]


@pytest.fixture()
def headed(tiny_bert_dir):
    model = medadapt.load(str(tiny_bert_dir), device="cpu")
    model.add_adapter(MoEConfig.paper(dim=model.get_embedding_dimension(), expansion=2), adapter_name="med")
    return model


def _tree(root: Path) -> dict[str, bytes | str]:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() and not p.is_symlink() else
                                             f"link->{os.readlink(p)}" if p.is_symlink() else "dir")
            for p in sorted(root.rglob("*"))}


def _non_adapter_folder(tmp_path):
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "thesis.tex").write_text("three years of work")
    (tmp_path / "keep" / "sub").mkdir()
    (tmp_path / "keep" / "sub" / "data.bin").write_bytes(os.urandom(64))
    return tmp_path / "keep", ("it is a non-empty folder that is not a medadapt adapter folder; "
                               "refusing to overwrite")


def _regular_file(tmp_path):
    (tmp_path / "f.txt").write_text("precious")
    return tmp_path / "f.txt", "it is an existing file; give a new or empty folder"


def _link_to_a_file(tmp_path):
    _regular_file(tmp_path)
    (tmp_path / "ln").symlink_to(tmp_path / "f.txt")
    return tmp_path / "ln", "it is an existing file"


def _under_a_file(tmp_path):
    _regular_file(tmp_path)
    return tmp_path / "f.txt" / "adapter", "f.txt is not a folder"


@pytest.mark.parametrize("case", [_non_adapter_folder, _regular_file, _link_to_a_file, _under_a_file])
def test_save_adapter_refuses_what_is_not_an_adapter_and_loses_nothing(headed, tmp_path, case):
    folder, message = case(tmp_path)
    before = _tree(tmp_path)
    with pytest.raises(ConfigError, match=f"^cannot write adapter folder {folder}: .*{message}"):
        save_adapter(headed, folder)
    assert _tree(tmp_path) == before  # byte-identical, and no hidden .tmp left beside it


def test_save_adapter_refuses_the_current_folder(headed, tmp_path, monkeypatch):
    (tmp_path / ADAPTER_CONFIG).write_text("{}")  # even one that looks like an adapter
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    with pytest.raises(ConfigError, match="current folder or one above it"):
        medadapt.save_adapter(headed, ".")
    assert _tree(tmp_path) == before


def test_save_adapter_replaces_an_adapter_and_fills_an_empty_folder(headed, tmp_path, tiny_bert_dir):
    (tmp_path / "empty").mkdir()
    save_adapter(headed, tmp_path / "empty")
    save_adapter(headed, tmp_path / "empty")  # now an adapter: replaced as a whole
    assert read_adapter_config(tmp_path / "empty")["adapters"].keys() == {"med"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_save_adapter_through_a_symlink_keeps_the_link(headed, tmp_path, tiny_bert_dir):
    expected = np.asarray(headed.encode_query(TEXTS))
    (tmp_path / "store").mkdir()
    link = tmp_path / "adapter"
    link.symlink_to(tmp_path / "store" / "med-v1")
    for _ in range(2):  # a dangling link first, then the folder it now points to
        assert medadapt.save_adapter(headed, link) == link
    assert link.is_symlink() and (tmp_path / "store" / "med-v1" / ADAPTER_CONFIG).is_file()
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["med-v1"]
    loaded = medadapt.load(str(link), device="cpu")  # the recorded base found from the link
    np.testing.assert_array_equal(np.asarray(loaded.encode_query(TEXTS)), expected)


def test_threads_saving_one_adapter_folder_all_succeed_and_it_always_loads(headed, tmp_path, tiny_bert_dir):
    """Several threads of one process (one process id) save into one folder: none deletes another's
    temporary folder, none fails, and the folder read at any moment is a complete, verified adapter."""
    folder = tmp_path / "adapter"
    save_adapter(headed, folder)
    errors, bad_reads, stop = [], [], threading.Event()

    def saver():
        try:
            for _ in range(3):
                save_adapter(headed, folder)
        except Exception as exc:  # noqa: BLE001 - any error is the failure under test
            errors.append(repr(exc))

    def reader():
        while not stop.is_set():
            try:
                read_adapter_config(folder)  # SHA256SUMS checked against the config and weights
            except Exception as exc:  # noqa: BLE001
                bad_reads.append(repr(exc))

    savers = [threading.Thread(target=saver) for _ in range(4)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in savers:
        t.start()
    for t in savers:
        t.join()
    stop.set()
    watcher.join()
    assert errors == [] and bad_reads == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]
    fresh = medadapt.load(str(tiny_bert_dir), device="cpu")
    assert fresh.load_adapter(str(folder)) == ["med"]  # its base fingerprint matches: not hashed mid-race
    expected = np.asarray(headed.encode_query(TEXTS))
    np.testing.assert_array_equal(np.asarray(fresh.encode_query(TEXTS)), expected)


def test_a_hyrec_models_adapter_save_follows_the_same_policy(tiny_bert_dir, tmp_path):
    """HyReCModel.save_adapter (a composed model: heads + lexical branch) refuses what save_adapter refuses,
    and otherwise swaps in a complete folder (adapter config and hyrec/ with its sums)."""
    import torch

    from medadapt.hyrec.model import HyReCConfig, HyReCModel, LexicalBranch

    torch.manual_seed(0)
    model = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCConfig(branch_layers=1, language="en",
                                                                      n_word_buckets=100))
    folder, message = _non_adapter_folder(tmp_path)
    before = _tree(tmp_path)
    with pytest.raises(ConfigError, match=message):
        model.save_adapter(folder, base=str(tiny_bert_dir))
    assert _tree(tmp_path) == before
    model.save_adapter(tmp_path / "branch", base=str(tiny_bert_dir))
    model.save_adapter(tmp_path / "branch", base=str(tiny_bert_dir))  # an adapter folder now: replaced
    assert (tmp_path / "branch" / ADAPTER_CONFIG).is_file()
    assert LexicalBranch.read(tmp_path / "branch" / "hyrec").config.n_word_buckets == 100  # sums verified
    assert sorted(p.name for p in tmp_path.iterdir()) == ["branch", "keep"]


def test_save_adapter_refuses_non_finite_heads(tiny_bert, tmp_path):
    """A head holding NaN would encode every text to NaN: one error, the old folder kept, no temporary left."""
    import torch

    from medadapt.errors import MedAdaptError
    from medadapt.moe.config import MoEConfig

    tiny_bert.add_adapter(MoEConfig.single_expert(32), adapter_name="moe")
    save_adapter(tiny_bert, tmp_path / "keep")
    before = {p.name: p.read_bytes() for p in (tmp_path / "keep").iterdir()}
    with torch.no_grad():
        next(p for n, p in tiny_bert.named_parameters() if "moe" in n).view(-1)[0] = float("nan")
    with pytest.raises(MedAdaptError, match="holds NaN or infinity"):
        save_adapter(tiny_bert, tmp_path / "keep")
    assert {p.name: p.read_bytes() for p in (tmp_path / "keep").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"]  # no temporary left


# ---------------------------------------------------------------------------- the base a folder records
def _plain_with_trained_head(base: Path, route=None):
    """``SentenceTransformer(path)`` (no medadapt.load) with a MoE head whose weights moved off zero."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(base), device="cpu")
    head = model.add_adapter(MoEConfig.paper(dim=model.get_embedding_dimension(), expansion=2),
                             adapter_name="med", route=route)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("given", ["absolute", "relative", "query-route"])
def test_a_head_on_a_plain_sentence_transformer_records_its_base_and_reloads(tiny_bert_dir, tmp_path,
                                                                            monkeypatch, given):
    """The issue's call: ``SentenceTransformer(path)`` + ``add_adapter`` + ``medadapt.save_adapter`` records
    the base folder (relative to the adapter, with its fingerprint), and both ``medadapt.load(folder)`` and
    ``load_adapter`` give the same embeddings, also after base and adapter moved together."""
    import shutil
    import warnings

    from sentence_transformers import SentenceTransformer

    from medadapt.adapters.files import base_fingerprint
    from medadapt.errors import MedAdaptWarning

    shutil.copytree(tiny_bert_dir, tmp_path / "work" / "models" / "bert")
    monkeypatch.chdir(tmp_path / "work")
    base = Path("models/bert") if given == "relative" else tmp_path / "work" / "models" / "bert"
    model = _plain_with_trained_head(base, route="query" if given == "query-route" else None)
    expected = np.asarray(model.encode_query(TEXTS))
    with warnings.catch_warnings():
        warnings.simplefilter("error", MedAdaptWarning)  # the base is identified: no warning
        folder = medadapt.save_adapter(model, tmp_path / "work" / "adapters" / "med")
    config = read_adapter_config(folder)
    assert config["base_model"]["relative_path"] == "../../models/bert"
    assert config["base_model_name_or_path"] == "../../models/bert" and config["revision"] is None
    assert config["base_model"]["name"] is None and config["base_model"]["folder_name"] == "bert"
    assert config["base_model"]["fingerprint"] == base_fingerprint(SentenceTransformer(str(base), device="cpu"))
    assert str(tmp_path) not in (folder / ADAPTER_CONFIG).read_text()  # never an absolute path
    monkeypatch.chdir(tmp_path)
    shutil.move(tmp_path / "work", tmp_path / "moved")  # base and adapter moved together
    place = tmp_path / "moved"
    loaded = medadapt.load(str(place / "adapters" / "med"), device="cpu")
    np.testing.assert_array_equal(np.asarray(loaded.encode_query(TEXTS)), expected)
    fresh = SentenceTransformer(str(place / "models" / "bert"), device="cpu")
    assert fresh.load_adapter(str(place / "adapters" / "med")) == ["med"]
    np.testing.assert_array_equal(np.asarray(fresh.encode_query(TEXTS)), expected)


def test_a_packaged_alias_folder_is_recorded_by_its_alias(tiny_bert_dir, tmp_path, monkeypatch):
    """A plain ``SentenceTransformer`` of a packaged alias's folder (``resolve_model_path("minilm")``) records
    the alias (``minilm``, found offline anywhere) and the alias's public hub id for PEFT tools; a folder
    that records that hub id loads through the alias once the fingerprint matches, without the hub."""
    from medadapt import models

    monkeypatch.setitem(models.ALIASES, "tiny-packaged", lambda: Path(tiny_bert_dir))
    monkeypatch.setitem(models.ALIAS_NAMES, "tiny-packaged", "medadapt-test/tiny-packaged")
    model = _plain_with_trained_head(Path(models.resolve_model_path("tiny-packaged")))
    expected = np.asarray(model.encode_query(TEXTS))
    folder = medadapt.save_adapter(model, tmp_path / "med")
    config = read_adapter_config(folder)
    assert config["base_model"]["name"] == "tiny-packaged" and config["base_model"]["relative_path"] is None
    assert config["base_model_name_or_path"] == "medadapt-test/tiny-packaged"
    np.testing.assert_array_equal(np.asarray(medadapt.load(str(folder), device="cpu").encode_query(TEXTS)),
                                  expected)
    by_hub_id = medadapt.save_adapter(model, tmp_path / "by-hub-id", base="medadapt-test/tiny-packaged")
    assert read_adapter_config(by_hub_id)["base_model"]["name"] == "medadapt-test/tiny-packaged"
    np.testing.assert_array_equal(np.asarray(medadapt.load(str(by_hub_id), device="cpu").encode_query(TEXTS)),
                                  expected)  # the alias, checked by fingerprint, instead of the (offline) hub


def test_a_hub_model_from_the_local_cache_is_recorded_by_its_hub_id(tiny_bert_dir, tmp_path, monkeypatch):
    """Offline, sentence-transformers records no ``base_model`` for a hub model; its transformer's
    ``_name_or_path`` is the hub id, kept when the model is in the local Hugging Face cache."""
    import shutil

    import huggingface_hub

    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--medadapt-test--tiny-bert"
    snapshot = shutil.copytree(tiny_bert_dir, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    model = _plain_with_trained_head(snapshot)
    model[0].auto_model.config._name_or_path = "medadapt-test/tiny-bert"  # what a hub load leaves there
    folder = medadapt.save_adapter(model, tmp_path / "med")
    config = read_adapter_config(folder)
    assert config["base_model"]["name"] == "medadapt-test/tiny-bert" == config["base_model_name_or_path"]
    assert config["base_model"]["relative_path"] is None


def _folder_deleted(tmp_path, tiny_bert_dir):
    import shutil

    base = shutil.copytree(tiny_bert_dir, tmp_path / "scratch")
    model = _plain_with_trained_head(base)
    shutil.rmtree(base)
    return model


def _built_in_memory(tmp_path, tiny_bert_dir):
    from conftest import build_tiny_bert
    from sentence_transformers import SentenceTransformer

    from medadapt.care import build_asymmetric_model

    query = SentenceTransformer(str(build_tiny_bert(tmp_path / "q", seed=3)), device="cpu")
    model = build_asymmetric_model(query, SentenceTransformer(str(tiny_bert_dir), device="cpu"), device="cpu")
    model.add_adapter(MoEConfig.paper(dim=model.get_embedding_dimension(), expansion=2), adapter_name="med")
    return model


@pytest.mark.parametrize("case", [_folder_deleted, _built_in_memory])
def test_an_unidentified_base_warns_once_at_save_and_loads_with_base(tiny_bert_dir, tmp_path, case):
    """No name, no folder (built in memory, or its folder is gone; a CARE model's first tower is *not* taken
    for the base): one warning at save saying how to pass ``base=``; loading then needs ``base=``."""
    import warnings

    from medadapt.errors import MedAdaptWarning, ModelLoadError

    model = case(tmp_path, tiny_bert_dir)
    expected = np.asarray(model.encode_query(TEXTS))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        folder = medadapt.save_adapter(model, tmp_path / "med")
    lines = [str(w.message) for w in caught if issubclass(w.category, MedAdaptWarning)]
    assert len(lines) == 1 and "records no base model" in lines[0] and "pass base=" in lines[0], lines
    config = read_adapter_config(folder)
    assert config["base_model"]["name"] is None and config["base_model"]["relative_path"] is None
    assert config["base_model_name_or_path"] is None
    with pytest.raises(ModelLoadError, match="records no base model.*pass base="):
        medadapt.load(str(folder))
    if case is _folder_deleted:  # the same weights elsewhere: base= finds them
        loaded = medadapt.load(str(folder), base=str(tiny_bert_dir), device="cpu")
        np.testing.assert_array_equal(np.asarray(loaded.encode_query(TEXTS)), expected)


def test_a_folder_without_the_peft_convention_keys_still_loads(headed, tmp_path, tiny_bert_dir):
    """Folders written before ``base_model_name_or_path`` / ``revision`` / the PEFT stub load as before."""
    import json

    from medadapt.adapters.files import COVERED, PEFT_STUB
    from medadapt.checksums import write_sums

    expected = np.asarray(headed.encode_query(TEXTS))
    folder = save_adapter(headed, tmp_path / "old")
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    del config["base_model_name_or_path"], config["revision"]
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config))
    (folder / PEFT_STUB).unlink()
    write_sums(folder, COVERED)
    np.testing.assert_array_equal(np.asarray(medadapt.load(str(folder), device="cpu").encode_query(TEXTS)),
                                  expected)


# ---------------------------------------------------------------------------- without medadapt imported
_WITHOUT_MEDADAPT = """
import sys
from sentence_transformers import SentenceTransformer
base, folder = sys.argv[1], sys.argv[2]
for call in (lambda: SentenceTransformer(base, device="cpu").load_adapter(folder),
             lambda: SentenceTransformer(folder, device="cpu")):
    try:
        call()
        print("LOADED")
    except Exception as exc:
        print(type(exc).__name__, str(exc))
assert not any(m == "medadapt" or m.startswith("medadapt.") for m in sys.modules), "medadapt was imported"
"""


def test_sentence_transformers_alone_says_the_folder_needs_medadapt(headed, tmp_path, tiny_bert_dir):
    """Before ``import medadapt.adapters``, ``load_adapter`` goes to PEFT, which reads ``adapter_config.json``
    first: the folder's stub makes both that and ``SentenceTransformer(folder)`` fail with a line that names
    medadapt and the call to use, instead of PEFT's "adapter model file not found"."""
    import subprocess
    import sys

    folder = save_adapter(headed, tmp_path / "med")
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_MEDADAPT, str(tiny_bert_dir), str(folder)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 2 and "LOADED" not in proc.stdout, proc.stdout
    for line in lines:
        assert "a medadapt adapter, not a PEFT one" in line and "medadapt.load(folder)" in line, line
        assert "import medadapt.adapters" in line, line


def test_a_peft_adapter_folder_still_goes_to_peft(tiny_bert_dir, tmp_path):
    """With medadapt imported, a real PEFT folder (``adapter_config.json``, no ``medadapt_adapter.json``) is
    still loaded by PEFT through ``load_adapter``."""
    import torch
    from peft import LoraConfig
    from sentence_transformers import SentenceTransformer

    lora = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    lora.add_adapter(LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value"], init_lora_weights=False),
                     adapter_name="lora")
    lora.transformers_model.save_pretrained(str(tmp_path / "peft"))
    expected = np.asarray(lora.encode_query(TEXTS))
    fresh = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    fresh.load_adapter(str(tmp_path / "peft"), adapter_name="lora")
    assert any("lora_A" in n for n, _ in fresh.named_parameters())
    np.testing.assert_allclose(np.asarray(fresh.encode_query(TEXTS)), expected, atol=1e-6)
    assert torch.is_tensor(next(iter(fresh.get_adapter_state_dict("lora").values())))
