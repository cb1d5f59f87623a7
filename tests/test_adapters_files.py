"""Adapter folders as outputs (medadapt.adapters.files.save_adapter): the output policy of medadapt.io, a
symlink written through, and several threads saving one folder. Nothing a user had is lost: refused saves
leave every pre-existing file byte-identical and nothing hidden beside them."""

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

    from medadapt.hyrec.model import HyReCConfig, HyReCModel

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
    assert HyReCModel.read_config(tmp_path / "branch").n_word_buckets == 100  # hyrec/SHA256SUMS verified
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
