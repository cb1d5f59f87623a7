"""Model cards of adapter folders (medadapt.cards): hub / PEFT conventions in the front matter, consistent
with ``medadapt_adapter.json``, and never what loading trusts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import medadapt
from medadapt.adapters.files import ADAPTER_CONFIG, read_adapter_config, save_adapter
from medadapt.adapters.linear import LinearHeadConfig
from medadapt.moe import MoEConfig  # importing a medadapt head config extends SentenceTransformer.add_adapter

pytestmark = pytest.mark.usefixtures("_single_thread")

TEXTS = ["symptoms of gout", "asthma treatment with an inhaler"]


def _front_matter(folder: Path) -> dict:
    text = (folder / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n"), text[:80]
    return yaml.safe_load(text.split("---\n")[1])


def _moe(dim):
    return MoEConfig.single_expert(dim)


def _linear(dim):
    return LinearHeadConfig()


@pytest.mark.parametrize(("head", "kind"), [(_moe, "moe"), (_linear, "linear")])
def test_adapter_card_and_config_follow_the_hub_conventions(tiny_bert, tmp_path, head, kind):
    """A hub base: ``base_model_name_or_path`` + ``revision`` in the config, ``base_model:``,
    ``library_name: sentence-transformers`` and the tags in the card, all naming the same model."""
    tiny_bert.model_card_data.base_model = "medadapt-test/tiny-bert"  # what sentence-transformers records
    tiny_bert.model_card_data.base_model_revision = "0123456789abcdef0123456789abcdef01234567"  # for a hub id
    tiny_bert.add_adapter(head(tiny_bert.get_embedding_dimension()), adapter_name="med")
    folder = save_adapter(tiny_bert, tmp_path / "med")
    config = read_adapter_config(folder)
    assert config["base_model_name_or_path"] == "medadapt-test/tiny-bert" == config["base_model"]["name"]
    assert config["revision"] == "0123456789abcdef0123456789abcdef01234567"
    meta = _front_matter(folder)
    assert meta["library_name"] == "sentence-transformers"
    assert meta["base_model"] == config["base_model_name_or_path"] and meta["base_model_relation"] == "adapter"
    assert {"medadapt", "sentence-transformers", kind} <= set(meta["tags"])
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert config["base_model"]["fingerprint"] in card  # the weights it is checked against


def test_a_local_base_is_no_hub_base_model(tiny_bert_dir, tmp_path):
    """A local folder is recorded relative to the adapter; the card names no ``base_model`` (the hub takes
    only hub ids there) and its tags still say what the folder is."""
    model = medadapt.load(str(tiny_bert_dir), device="cpu")
    model.add_adapter(MoEConfig.single_expert(model.get_embedding_dimension()), adapter_name="med")
    folder = save_adapter(model, tmp_path / "med")
    config = read_adapter_config(folder)
    assert config["base_model_name_or_path"] == config["base_model"]["relative_path"]
    assert config["revision"] is None
    meta = _front_matter(folder)
    assert "base_model" not in meta and meta["library_name"] == "sentence-transformers"
    assert {"medadapt", "sentence-transformers", "moe"} <= set(meta["tags"])


def test_an_edited_card_changes_nothing_that_loads(tiny_bert_dir, tmp_path):
    """The card is documentation (hub users edit it): it is not in ``SHA256SUMS`` and loading never reads it,
    so a card naming another base still loads the recorded, fingerprint-checked base, while the same edit in
    ``medadapt_adapter.json`` is refused."""
    from medadapt.errors import ModelLoadError

    model = medadapt.load(str(tiny_bert_dir), device="cpu")
    model.add_adapter(MoEConfig.single_expert(model.get_embedding_dimension(), zero_init_output=False),
                      adapter_name="med")
    expected = np.asarray(model.encode_query(TEXTS))
    folder = save_adapter(model, tmp_path / "med")
    assert "README.md" not in (folder / "SHA256SUMS").read_text()
    card = folder / "README.md"
    card.write_text(card.read_text().replace("library_name: sentence-transformers",
                                             "library_name: sentence-transformers\nbase_model: evil/other"))
    assert _front_matter(folder)["base_model"] == "evil/other"
    np.testing.assert_array_equal(np.asarray(medadapt.load(str(folder), device="cpu").encode_query(TEXTS)),
                                  expected)
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    config["base_model_name_or_path"] = "evil/other"
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="medadapt_adapter.json: checksum differs from SHA256SUMS"):
        medadapt.load(str(folder))
