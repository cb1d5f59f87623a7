"""HyReC model: GLAE split, forward shapes, vocabulary extension, save/load round trip, lexical index vs
brute force, frozen-variant state cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from medadapt.errors import ConfigError, ModelLoadError
from medadapt.hyrec.data import SharedStateCache
from medadapt.hyrec.glae import encoder_layers, split_layers, truncate_layers
from medadapt.hyrec.model import HyReCConfig, HyReCModel

TEXTS = ["what are the symptoms of gout", "asthma is a condition with wheezing inhaler airway breath cough",
         "diabetes: blood sugar insulin thirst 500mg", "treatment of migraine depends on symptoms"]


def make(tiny_bert_dir, **kw) -> HyReCModel:
    torch.manual_seed(0)
    cfg = HyReCConfig(**{"branch_layers": 1, "language": "en", "pooling": "mean", "n_word_buckets": 1000,
                         "query_max_length": 16, "passage_max_length": 32, **kw})
    return HyReCModel.from_backbone(str(tiny_bert_dir), cfg)


def test_glae_split_copies_pretrained_layers(tiny_bert):
    auto = tiny_bert[0].auto_model
    shared, dense, lexicon = split_layers(auto, 1)
    layers = encoder_layers(auto)
    assert len(shared) == 1 and len(dense) == 1 and len(lexicon) == 1
    assert shared[0] is layers[0] and dense[0] is layers[1]
    assert lexicon[0] is not dense[0]
    for (n1, p1), (n2, p2) in zip(lexicon[0].named_parameters(), dense[0].named_parameters()):
        assert n1 == n2 and p1.shape == p2.shape and torch.equal(p1, p2)
        assert p1.data_ptr() != p2.data_ptr()
    with pytest.raises(ConfigError, match="branch_layers"):
        split_layers(auto, 3)
    with pytest.raises(ConfigError, match="lexicon_layers"):
        split_layers(auto, 1, 2)


def test_truncate_layers(tiny_bert):
    auto = tiny_bert[0].auto_model
    truncate_layers(auto, 1)
    assert len(encoder_layers(auto)) == 1 and auto.config.num_hidden_layers == 1
    with pytest.raises(ConfigError):
        truncate_layers(auto, 5)


def test_forward_shapes_and_term_mask(tiny_bert_dir):
    model = make(tiny_bert_dir)
    feats = model.tokenize(TEXTS, "document")
    with torch.no_grad():
        out = model(feats)
    B, T = feats["input_ids"].shape
    assert out["dense"].shape == (B, 32)
    assert out["term_weights"].shape == (B, T) and out["union_logits"].shape == (B, T, 4)
    assert (out["term_weights"] >= 0).all()
    specials = torch.isin(feats["input_ids"], torch.tensor(model.tokenizer.all_special_ids))
    assert (out["term_weights"][specials] == 0).all()
    vec = model.term_vectors(out["term_weights"], feats["input_ids"])
    assert vec.shape == (B, model.vocab_size)
    r = 0
    for t in feats["input_ids"][r].unique():
        pos = feats["input_ids"][r] == t
        assert vec[r, t] == pytest.approx(float(out["term_weights"][r][pos].max()))


def test_frozen_variant_freezes_only_the_sharing_backbone(tiny_bert_dir):
    model = make(tiny_bert_dir, variant="frozen")
    assert not any(p.requires_grad for p in model.shared_parameters())
    assert all(p.requires_grad for p in model.lexicon.parameters())
    assert all(p.requires_grad for layer in model.dense_layers for p in layer.parameters())


def test_untrained_dense_side_equals_backbone(tiny_bert_dir, tiny_bert):
    model = make(tiny_bert_dir, passage_max_length=64)
    ours = model.encode_dense(TEXTS, "document")
    ref = tiny_bert.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(ours, ref, atol=1e-5)  # identity projector, same mean pooling


def test_encode_lexical_is_normalised_and_within_term_range(tiny_bert_dir):
    model = make(tiny_bert_dir)
    with torch.no_grad():
        model.weight_proj.linear.bias.fill_(1.0)  # make every term active
        model.union_proj.linear.weight.zero_()
        model.union_proj.linear.bias.copy_(torch.tensor([0.0, 0.0, 5.0, 0.0]))  # all M: one word per text
    vecs = model.encode_lexical(TEXTS, "document")
    for v in vecs:
        assert v and all(0 <= t < model.n_terms for t in v)
        assert sum(w * w for w in v.values()) == pytest.approx(1.0)
    assert any(t >= model.vocab_size for v in vecs for t in v)  # bagged words above the tokenizer vocabulary
    decoded = model.decode(vecs[0], top=3)
    assert len(decoded) == 3 and all(isinstance(s, str) for s, _ in decoded)


def _perturbed(tiny_bert_dir) -> HyReCModel:
    model = make(tiny_bert_dir)
    with torch.no_grad():
        model.weight_proj.linear.bias.fill_(0.5)
        for p in model.lexicon.parameters():
            p.add_(0.01 * torch.randn_like(p))
        model.projector.linear.weight.mul_(1.1)
    return model


def _outputs(model) -> dict:
    """Dense and sparse encodings of both roles (the retrieval protocol's view of the model)."""
    return {role: (model.encode_dense(TEXTS, role), model.encode_lexical(TEXTS, role)) for role in ("query", "document")}


def _assert_same(a: dict, b: dict) -> None:
    for role in a:
        np.testing.assert_array_equal(a[role][0], b[role][0])
        assert a[role][1] == b[role][1]


def save_old_layout(model: HyReCModel, folder) -> None:
    """The layout before the lexical branch was a module: the dense side as a plain sentence-transformers
    folder plus ``hyrec/`` (the same files, config without ``lexicon_layer``)."""
    from sentence_transformers import SentenceTransformer

    from medadapt.checksums import write_sums
    from medadapt.hyrec.model import LEXICAL_FILES, dense_modules

    SentenceTransformer(modules=dense_modules(model.st), device="cpu").save(str(folder))
    model.branch.save(str(folder / "hyrec"))
    config = json.loads((folder / "hyrec" / "config.json").read_text())
    del config["lexicon_layer"]
    (folder / "hyrec" / "config.json").write_text(json.dumps(config))
    write_sums(folder / "hyrec", LEXICAL_FILES)


def test_save_load_both_ways_is_exact(tiny_bert_dir, tmp_path):
    """The lexical branch is a module of the saved sentence-transformers folder: medadapt.load and plain
    SentenceTransformer(folder, trust_remote_code=True) give the model's dense and sparse outputs bit for bit."""
    from sentence_transformers import SentenceTransformer

    import medadapt
    from medadapt.hyrec.model import LexicalBranch
    from medadapt.retrieval.encoders import SparseEncoder, as_encoder, open_encoder

    model = _perturbed(tiny_bert_dir)
    before, dense_st = _outputs(model), model.st.encode(TEXTS)
    model.save(tmp_path / "m")
    assert not (tmp_path / "m" / "hyrec").exists()
    assert json.loads((tmp_path / "m" / "modules.json").read_text())[-1]["type"] == "medadapt.hyrec.model.LexicalBranch"
    loaded = medadapt.load(str(tmp_path / "m"), device="cpu")
    plain = SentenceTransformer(str(tmp_path / "m"), trust_remote_code=True, device="cpu")
    for st in (loaded, plain):
        assert isinstance(st[-1], LexicalBranch)
        encoder = as_encoder(st)  # the capability of the loaded model: dense + learned sparse
        assert isinstance(encoder, SparseEncoder) and encoder.n_terms == model.n_terms
        _assert_same(before, _outputs(encoder))
        np.testing.assert_array_equal(st.encode(TEXTS), dense_st)  # the branch leaves the embedding unchanged
    again = HyReCModel.load(tmp_path / "m")
    _assert_same(before, _outputs(again))
    _assert_same(before, _outputs(open_encoder(str(tmp_path / "m"))))
    assert again.config == model.config and set(model.words.strings) <= set(again.words.strings)
    assert again.encoder_identity() == model.encoder_identity()
    with pytest.raises(ModelLoadError):
        HyReCModel.load(tiny_bert_dir)  # a model without a lexical branch


def test_a_composed_folder_opens_both_ways_with_identical_outputs(tiny_bert, tiny_bert_dir, tmp_path):
    """A MoE head plus the lexical branch on a frozen backbone (what ``branches: [{kind: hyrec_lexical}]``
    builds): the whole folder opens with medadapt.load and plain SentenceTransformer, the adapter-only folder
    (heads tied to the base, the branch in ``hyrec/``) with medadapt.load, all bit for bit."""
    from sentence_transformers import SentenceTransformer

    import medadapt
    from medadapt.moe import MoEConfig
    from medadapt.retrieval.encoders import as_encoder

    torch.manual_seed(0)
    tiny_bert.add_adapter(MoEConfig.single_expert(32, zero_init_output=False), adapter_name="med")
    model = HyReCModel(tiny_bert, HyReCConfig(branch_layers=1, language="en", pooling="mean", variant="frozen",
                                              n_word_buckets=1000, query_max_length=16, passage_max_length=32))
    with torch.no_grad():
        model.weight_proj.linear.bias.fill_(0.5)
    before = _outputs(model)
    model.save(tmp_path / "whole")
    model.save_adapter(tmp_path / "adapter", base=str(tiny_bert_dir))
    assert json.loads((tmp_path / "adapter" / "side_modules.json").read_text())[0]["path"] == "hyrec"
    side = tmp_path / "adapter" / "side_modules.json"
    for ref in ("medadapt.__main__.main", "medadapt.models.load", "os.system"):  # never imported or run
        side.write_text(json.dumps([{"path": "hyrec", "type": ref}]))
        with pytest.raises(ModelLoadError, match="not a module class of the installed medadapt"):
            medadapt.load(str(tmp_path / "adapter"))
    side.write_text(json.dumps([{"path": "hyrec", "type": "medadapt.hyrec.model.LexicalBranch"}]))
    for st in (medadapt.load(str(tmp_path / "whole"), device="cpu"), medadapt.load(str(tmp_path / "adapter")),
               SentenceTransformer(str(tmp_path / "whole"), trust_remote_code=True, device="cpu")):
        assert [type(m).__name__ for m in st][-3:] == ["AdapterStack", "Normalize", "LexicalBranch"]
        _assert_same(before, _outputs(as_encoder(st)))


def test_a_folder_of_the_old_layout_opens_with_identical_outputs(tiny_bert_dir, tmp_path):
    """A ``hyrec/`` side folder (the layout before the branch was a module) is appended on load by
    medadapt.load and HyReCModel.load; saving it again writes the new layout."""
    import medadapt
    from medadapt.retrieval.encoders import as_encoder, offers_sparse

    model = _perturbed(tiny_bert_dir)
    before = _outputs(model)
    save_old_layout(model, tmp_path / "old")
    assert offers_sparse(str(tmp_path / "old")) and not offers_sparse(str(tiny_bert_dir))
    _assert_same(before, _outputs(HyReCModel.load(tmp_path / "old")))
    upgraded = as_encoder(medadapt.load(str(tmp_path / "old"), device="cpu"))
    _assert_same(before, _outputs(upgraded))
    assert upgraded.encoder_identity() == model.encoder_identity()  # indexes built from the old folder open
    upgraded.save(tmp_path / "new")
    assert not (tmp_path / "new" / "hyrec").exists()
    _assert_same(before, _outputs(HyReCModel.load(tmp_path / "new")))


def test_a_lexical_side_of_format_1_loads_with_a_warning(tiny_bert_dir, tmp_path):
    from medadapt.errors import MedAdaptWarning

    model = make(tiny_bert_dir)
    save_old_layout(model, tmp_path / "m")
    sub = tmp_path / "m" / "hyrec"
    (sub / "SHA256SUMS").unlink()
    config = json.loads((sub / "config.json").read_text())
    (sub / "config.json").write_text(json.dumps({**config, "format_version": 1}))
    with pytest.warns(MedAdaptWarning, match="saved before hyrec/SHA256SUMS existed"):
        again = HyReCModel.load(tmp_path / "m")
    assert again.encode(TEXTS, "document")[1] == model.encode(TEXTS, "document")[1]


@pytest.mark.parametrize("damage", ["scale-lexical", "edit-config", "no-sums", "truncate-config"])
def test_a_damaged_lexical_side_is_refused_before_it_is_read(tiny_bert_dir, tmp_path, damage):
    """The branch's files decide the lexical scores: a file changed behind the model's back (valid, same
    names) must not load as another model."""
    from safetensors.torch import load_file, save_file

    make(tiny_bert_dir).save(tmp_path / "m")
    [sub] = (tmp_path / "m").glob("*_LexicalBranch")
    if damage == "scale-lexical":
        state = load_file(str(sub / "lexical.safetensors"))
        save_file({k: 100 * v for k, v in state.items()}, str(sub / "lexical.safetensors"))
        match = "lexical.safetensors: checksum differs"
    elif damage == "edit-config":
        config = json.loads((sub / "config.json").read_text())
        (sub / "config.json").write_text(json.dumps({**config, "min_union": 0.9}))
        match = "config.json: checksum differs"
    elif damage == "no-sums":
        (sub / "SHA256SUMS").unlink()
        match = "SHA256SUMS is missing"
    else:
        (sub / "config.json").write_text((sub / "config.json").read_text()[:20])
        match = "config.json: checksum differs"
    with pytest.raises(ModelLoadError, match=match):
        HyReCModel.load(tmp_path / "m")
    if damage == "truncate-config":  # `medadapt eval` loads the model first: one error line, no traceback
        from typer.testing import CliRunner

        from conftest import build_tiny_beir
        from medadapt.cli import app

        beir = build_tiny_beir(tmp_path / "beir")
        res = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "m"), "--data", str(beir), "--split",
                                       "test", "-q"])
        assert res.exit_code == 1 and "Traceback" not in res.output and "checksum differs" in res.output


def test_the_state_cache_key_follows_the_tokenizer(tiny_bert_dir, tmp_path):
    """Same weights, tokenizer without lowercasing: other token ids, so another state-cache namespace."""
    import shutil

    cased = tmp_path / "cased"
    shutil.copytree(tiny_bert_dir, cased)
    definition = json.loads((cased / "tokenizer.json").read_text())
    definition["normalizer"]["lowercase"] = False
    (cased / "tokenizer.json").write_text(json.dumps(definition))
    a, b = make(tiny_bert_dir, variant="frozen"), make(cased, variant="frozen")
    assert a.shared_fingerprint() != b.shared_fingerprint()
    assert SharedStateCache(None).namespace(a, "query") != SharedStateCache(None).namespace(b, "query")


def test_lexical_index_equals_brute_force(tiny_bert_dir):
    from medadapt.retrieval.lexical import LexicalIndex

    model = make(tiny_bert_dir)
    with torch.no_grad():
        model.weight_proj.linear.bias.fill_(0.3)
    docs = model.encode_lexical(TEXTS, "document")
    queries = model.encode_lexical(["symptoms of gout", "insulin for diabetes", "cough"], "query")
    index = LexicalIndex.from_sparse(docs, n_terms=model.n_terms)
    scores, idx = index.search(queries, k=len(docs))
    for r, q in enumerate(queries):
        brute = np.array([sum(w * d.get(t, 0.0) for t, w in q.items()) for d in docs], dtype=np.float32)
        found = {int(i): float(s) for s, i in zip(scores[r], idx[r]) if i >= 0}
        for i, s in found.items():
            assert s == pytest.approx(brute[i], abs=1e-5)
        assert {i for i in range(len(docs)) if brute[i] > 0} == set(found)
        assert list(found) == sorted(found, key=lambda i: (-brute[i], i))


def test_state_cache_gives_the_same_outputs(tiny_bert_dir, tmp_path, monkeypatch):
    from medadapt.cache import EmbeddingCache

    model = make(tiny_bert_dir, variant="frozen")
    with torch.no_grad():
        model.weight_proj.linear.bias.fill_(0.3)
    d1, l1 = model.encode(TEXTS, "document")
    cache = SharedStateCache(tmp_path / "states", chunk_size=2)
    d2, l2 = model.encode(TEXTS, "document", state_cache=cache)
    np.testing.assert_allclose(d1, d2, atol=2e-3)  # states are stored in fp16
    assert set(map(frozenset, l1)) == set(map(frozenset, l2))
    [shard_dir] = {p.parent for p in (tmp_path / "states").rglob("shard-*.safetensors")}
    meta = json.loads((shard_dir / "meta.json").read_text())  # a token-states namespace of the EmbeddingCache
    assert meta["stored"] == "token_states" and meta["model"] == model.shared_fingerprint()
    fresh = SharedStateCache(EmbeddingCache(tmp_path / "states"))  # another run on the same cache
    monkeypatch.setattr(model, "shared_states", lambda *a, **k: pytest.fail("states computed again"))
    ids, mask, states = fresh.batch(model, TEXTS[:2], "document")  # read back from disk
    monkeypatch.undo()
    ref = model.tokenize(TEXTS[:2], "document")
    assert torch.equal(ids, ref["input_ids"]) and torch.equal(mask, ref["attention_mask"])
    d3, _ = model.encode(TEXTS, "document", state_cache=cache, lexical=False, cached_pooled=True)
    np.testing.assert_allclose(d2, d3, atol=1e-5)


@pytest.mark.parametrize("damage", ["flip-a-state", "truncate", "no-checksum"])
def test_a_damaged_state_shard_is_set_aside_and_encoded_again(tiny_bert_dir, tmp_path, damage):
    from safetensors.torch import load_file, save_file

    from medadapt.errors import MedAdaptWarning

    model = make(tiny_bert_dir, variant="frozen")
    SharedStateCache(tmp_path / "states", chunk_size=100).ensure(model, TEXTS, "document")
    [shard] = list((tmp_path / "states").rglob("shard-*.safetensors"))
    if damage == "flip-a-state":  # same size, still parses: only the checksum can tell
        data = bytearray(shard.read_bytes())
        data[-2] ^= 0x40
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-20])
    else:
        save_file(load_file(str(shard)), str(shard))  # the same tensors, no checksum
    fresh = SharedStateCache(tmp_path / "states")
    with pytest.warns(MedAdaptWarning, match="HyReC state cache: shard-.*set aside"):
        ids, mask, states = fresh.batch(model, TEXTS, "document")
    assert (shard.parent / f"corrupt-{shard.name}").is_file()
    _, _, expected = SharedStateCache(None).batch(model, TEXTS, "document")
    torch.testing.assert_close(states, expected, atol=0, rtol=0)  # encoded again, not the damaged values


def test_state_cache_sees_weights_written_through_tensor_data(tiny_bert_dir):
    """``.data`` writes bypass torch's version counter; the memo's norm check still sees them."""
    model = make(tiny_bert_dir, variant="frozen")
    cache = SharedStateCache(None)
    before = cache.namespace(model, "document")
    model.auto_model.embeddings.word_embeddings.weight.data.mul_(1.01)
    assert cache.namespace(model, "document") != before


def test_extend_vocabulary_adds_unknown_cjk_characters(tiny_bert_dir):
    cfg = HyReCConfig(branch_layers=1, language="zh", n_word_buckets=10)
    base = HyReCModel.from_backbone(str(tiny_bert_dir), cfg)
    model = HyReCModel.from_backbone(str(tiny_bert_dir), cfg, extend_with=["高血压患者", "血压"], seed=1)
    assert model.vocab_size == base.vocab_size + 5
    assert model.auto_model.get_input_embeddings().weight.shape[0] == model.vocab_size
    ids = model.tokenize(["高血压"], "query")["input_ids"][0].tolist()
    assert model.tokenizer.unk_token_id not in ids and all(i >= base.vocab_size for i in ids[1:-1])
    again = HyReCModel.from_backbone(str(tiny_bert_dir), cfg, extend_with=["高血压患者", "血压"], seed=1)
    assert model.shared_fingerprint() == again.shared_fingerprint()


def test_union_source_labels_bags_words_like_the_labelling_tool(tiny_bert_dir):
    """`union_source="labels"` bags tokens by the labelling tool's segmentation (the paper's "Jieba" row), even
    for a model trained without a union head; each word's weight is the max of its tokens' weights (eq. 8)."""
    from medadapt.hyrec.bagging import group_words
    from medadapt.hyrec.labels import IGNORE, UnionLabeler

    model = make(tiny_bert_dir, union=False)
    text = "blood sugar hypoglycaemia insulin"  # the tiny WordPiece splits "hypoglycaemia" into 10 pieces
    plain = model.encode_lexical([text], role="query")[0]
    assert all(t < model.tokenizer.vocab_size for t in plain)  # no union head: tokens only
    model.config.union_source = "labels"
    bagged = model.encode_lexical([text], role="query")[0]
    enc = UnionLabeler(model.tokenizer, "en")(text, max_length=16)
    keep = [i for i, lab in enumerate(enc["union_labels"]) if lab != IGNORE]  # special tokens carry no label
    ids = [enc["input_ids"][i] for i in keep]
    multi = [[ids[j] for j in g] for g in group_words([enc["union_labels"][i] for i in keep]) if len(g) > 1]
    assert multi, "the example must contain a multi-piece word"
    words = {t: w for t, w in bagged.items() if t >= model.tokenizer.vocab_size}
    # a word's weight is the max of its tokens' weights (eq. 8); a token with weight 0 (ReLU) is not a term,
    # and a word whose tokens all weigh 0 is not emitted either
    heaviest = {model.words.word_id(g): max(bagged.get(t, 0.0) for t in g) for g in multi}
    assert words and set(words) == {wid for wid, w in heaviest.items() if w > 0}
    for wid, w in words.items():
        assert w == pytest.approx(heaviest[wid])
    model.config.union_source = "learned"
    assert model.encode_lexical([text], role="query")[0] == plain


def test_state_cache_memo_is_per_model_object_not_per_address(tiny_bert_dir):
    """Two different models must never share memoised fingerprints, even if one is collected and the other
    reuses its memory address (the memo holds weak references, keyed by the object)."""
    import gc

    cache = SharedStateCache(None)
    a = make(tiny_bert_dir)
    ns_a = cache.namespace(a, "query")
    fp_a = cache._fingerprint(a, "lexicon")
    del a
    gc.collect()
    assert len(cache._memo) == 0  # the collected model's entries went with it
    b = make(tiny_bert_dir, query_max_length=12)  # a different query length: a different namespace
    with torch.no_grad():
        for p in b.lexicon.parameters():
            p.add_(1.0)
    assert cache.namespace(b, "query") != ns_a
    assert cache._fingerprint(b, "lexicon") != fp_a


def test_state_cache_lexicon_states_follow_a_trained_lexicon_encoder(tiny_bert_dir):
    """Lexicon states cached before the lexicon encoder changed in place (an optimizer step with
    ``train_lexicon_encoder``, ``load_state_dict``) are never served afterwards: the memoised fingerprint is
    re-validated against the weights' version counters, and the stale states are dropped. While the weights
    are unchanged the memo (and the cached states) are reused."""
    model = make(tiny_bert_dir, variant="frozen")
    cache = SharedStateCache(None)
    _, _, before = cache.lexicon_batch(model, TEXTS, "document")
    assert cache._fingerprint(model, "lexicon") is cache._fingerprint(model, "lexicon")  # memo hit
    fp = cache._fingerprint(model, "lexicon")
    original = {k: v.clone() for k, v in model.lexicon.state_dict().items()}
    with torch.no_grad():
        for p in model.lexicon.parameters():
            p.mul_(1.5)
    _, mask, after = cache.lexicon_batch(model, TEXTS, "document")
    assert cache._fingerprint(model, "lexicon") != fp
    ids, mask2, states = cache.batch(model, TEXTS, "document")
    model.eval()
    with torch.no_grad():
        fresh = model.lexicon_states(states, mask2).float()
    valid = mask.bool()
    assert not torch.allclose(before[valid], after[valid])
    torch.testing.assert_close(after[valid], fresh[valid])
    assert sum(k.split("|")[1] == "lexicon" for k in cache._pooled_mem) == 1  # the stale entry was dropped
    model.lexicon.load_state_dict(original)  # back to the original weights
    assert cache._fingerprint(model, "lexicon") == fp  # content, not object identity


def _labels_for(model, texts, role, length):
    from medadapt.hyrec.data import UnionLabelCache

    return UnionLabelCache(model, model.config.language).labels(texts, role, length)


@pytest.mark.parametrize("keep_subterms", [True, False])
def test_training_time_words_match_inference_bagging(tiny_bert_dir, keep_subterms):
    """The training-time lexical score over tokens + labelled words (eq. 10) equals the dot product of the
    sparse vectors that inference bags from the same labels (union_source: labels), before normalisation,
    and the normalised vectors ``encode_lexical`` returns."""
    from medadapt.hyrec.bagging import sparse_from_tokens

    model = make(tiny_bert_dir, union_source="labels", keep_subterms=keep_subterms, passage_max_length=64)
    texts = ["gout and levothyroxine", "levothyroxine for thyroid treatment"]  # multi-piece: l ##e ##v ...
    feats = model.tokenize(texts, "document")
    with torch.no_grad():
        model.weight_proj.linear.bias.fill_(1.0)
        out = model(feats)
    labels = _labels_for(model, texts, "document", feats["input_ids"].shape[1])
    weights, ids = model.bagged_terms(out["term_weights"], out["input_ids"], out["term_mask"], labels)
    assert weights.shape == ids.shape and weights.shape[1] > feats["input_ids"].shape[1]  # words were added
    assert (ids[:, feats["input_ids"].shape[1]:][weights[:, feats["input_ids"].shape[1]:] > 0]
            >= model.vocab_size).all()
    v = model.compact_term_vectors((weights, ids))[0]
    train_score = float(v[0] @ v[1])
    sparse = []
    for r in range(2):
        keep = out["term_mask"][r]
        lab = labels[r][keep].clamp_min(0)
        probs = torch.nn.functional.one_hot(lab, 4).float().numpy()
        sparse.append(sparse_from_tokens(out["input_ids"][r][keep].numpy(), out["term_weights"][r][keep].numpy(),
                                         probs, model.words, keep_subterms=keep_subterms))
    infer_score = sum(w * sparse[1].get(t, 0.0) for t, w in sparse[0].items())
    shared_words = [t for t in set(sparse[0]) & set(sparse[1]) if t >= model.vocab_size]
    assert shared_words  # a shared learned word
    vecs = model.encode_lexical(texts, "document")  # the same, normalised
    norm = [float(v.norm()) for v in model.compact_term_vectors((weights, ids))[0]]
    assert sum(w * vecs[1].get(t, 0.0) for t, w in vecs[0].items()) == pytest.approx(
        train_score / (norm[0] * norm[1]), rel=1e-5)
    assert train_score == pytest.approx(infer_score, rel=1e-5)


def test_bagged_word_weight_is_max_of_its_tokens_and_differentiable(tiny_bert_dir):
    from medadapt.hyrec.labels import B, E, IGNORE, M, S

    model = make(tiny_bert_dir)
    ids = torch.tensor([[101, 7, 8, 9, 10, 102]])
    mask = torch.tensor([[False, True, True, True, True, False]])
    w = torch.tensor([[0.0, 0.2, 0.9, 0.4, 0.3, 0.0]], requires_grad=True)
    labels = torch.tensor([[IGNORE, S, B, M, E, IGNORE]])
    weights, terms = model.bagged_terms(w, ids, mask, labels)
    assert terms.shape == (1, 7) and int(terms[0, 6]) == model.words.word_id([8, 9, 10])
    assert float(weights[0, 6]) == pytest.approx(0.9)
    weights[0, 6].backward()
    assert w.grad.tolist() == [[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]]  # eq. 8's max routes the gradient
    same, same_ids = model.bagged_terms(w, ids, mask, None)
    assert same is w and same_ids is ids


def test_compact_term_vectors_equal_full_vocabulary_vectors(tiny_bert_dir):
    model = make(tiny_bert_dir)
    feats_q, feats_d = model.tokenize(TEXTS[:2], "query"), model.tokenize(TEXTS, "document")
    with torch.no_grad():
        model.weight_proj.linear.bias.fill_(1.0)
        q, d = model(feats_q), model(feats_d)
    cq, cd = model.compact_term_vectors((q["term_weights"], q["input_ids"]), (d["term_weights"], d["input_ids"]))
    fq = model.term_vectors(q["term_weights"], q["input_ids"])
    fd = model.term_vectors(d["term_weights"], d["input_ids"])
    torch.testing.assert_close(cq @ cd.T, fq @ fd.T)


def test_union_context_head_ignores_padding_and_round_trips(tiny_bert_dir, tmp_path):
    model = make(tiny_bert_dir, union_context=2)
    assert model.union_proj.context == 2
    short, long_ = "gout pain", "asthma is a condition with wheezing inhaler airway breath cough"
    alone = model.tokenize([short], "document")
    both = model.tokenize([short, long_], "document")
    with torch.no_grad():
        a = model(alone)["union_logits"][0]
        b = model(both)["union_logits"][0, : a.shape[0]]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)  # padding of the batch does not leak into a row
    with torch.no_grad():
        for p in model.union_proj.parameters():
            p.add_(0.1 * torch.randn_like(p))
    l1 = model.encode_lexical(TEXTS, "document")
    model.save(tmp_path / "m")
    again = HyReCModel.load(tmp_path / "m")
    assert again.config.union_context == 2 and again.encode_lexical(TEXTS, "document") == l1


def test_one_encoding_pass_checks_the_state_cache_fingerprints_once_and_the_next_pass_sees_new_weights(
        tiny_bert_dir, monkeypatch):
    """Inside one ``encode`` call the weights are fixed, so the cache's memoised namespace / fingerprints are
    checked against them once (not per batch); a weight change between two calls is still seen."""
    import contextlib

    import medadapt.hyrec.data as hyrec_data

    model = make(tiny_bert_dir, variant="frozen")
    cache = SharedStateCache(None)
    texts = [f"{t} {i}" for i in range(6) for t in TEXTS]
    calls = []
    real = hyrec_data._versions
    monkeypatch.setattr(hyrec_data, "_versions", lambda mods: calls.append(1) or real(mods))
    kw = {"state_cache": cache, "cached_lexicon": True, "batch_size": 2}
    dense, lex = model.encode(texts, "document", **kw)
    batches = -(-len(texts) // 2)
    assert 0 < len(calls) <= 4 < batches  # namespace + lexicon fingerprint (+ pooled): once each per pass
    unpinned = SharedStateCache(None)  # the same pass with the per-batch checks, as before pinning
    monkeypatch.setattr(unpinned, "pinned", lambda m: contextlib.nullcontext())
    calls.clear()
    ref_dense, ref_lex = model.encode(texts, "document", **{**kw, "state_cache": unpinned})
    assert len(calls) >= batches
    np.testing.assert_array_equal(dense, ref_dense)
    assert lex == ref_lex
    with torch.no_grad():
        for p in model.lexicon.parameters():
            p.mul_(1.5)
    _, lex2 = model.encode(texts, "document", **kw)
    _, ref2 = model.encode(texts, "document", **{**kw, "state_cache": unpinned})
    assert lex2 != lex and lex2 == ref2
    assert cache._pinned == {}


def test_the_dense_projector_is_a_linear_head_and_folders_naming_it_load(tiny_bert, tmp_path):
    """``DenseProjector`` (eq. 6) is the identity-initialised :class:`LinearHead` with a bias, kept under the class
    path and configuration every HyReC folder names: such a folder loads to the same embeddings."""
    import medadapt
    from medadapt.adapters import attach, find_head
    from medadapt.adapters.linear import LinearHead
    from medadapt.hyrec.projectors import DenseProjector

    dim = tiny_bert.get_embedding_dimension()
    old_config = {"in_features": dim, "out_features": dim, "identity_init": True}
    assert DenseProjector(dim).get_config_dict() == old_config
    for bad in ({"out_features": dim + 1}, {"identity_init": False}):
        with pytest.raises(ConfigError, match="square and identity-initialised"):
            DenseProjector(dim, **bad)
    frozen = tiny_bert.encode(TEXTS, convert_to_tensor=True)
    head = LinearHead(dim, bias=True)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    model = attach(tiny_bert, head).eval()
    expected = model.encode(TEXTS, convert_to_tensor=True)
    assert not torch.allclose(expected, frozen, atol=1e-3)
    model.save(str(tmp_path / "m"))
    modules = json.loads((tmp_path / "m" / "modules.json").read_text())
    entry = next(m for m in modules if m["type"] == "medadapt.adapters.linear.LinearHead")
    entry["type"] = "medadapt.hyrec.projectors.DenseProjector"  # what HyReC folders name, with its config
    (tmp_path / "m" / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "m" / entry["path"] / "config.json").write_text(json.dumps(old_config))
    reloaded = medadapt.load(str(tmp_path / "m"), device="cpu")
    projector = find_head(reloaded, DenseProjector)
    assert isinstance(projector, LinearHead) and projector.get_config_dict() == old_config
    torch.testing.assert_close(reloaded.encode(TEXTS, convert_to_tensor=True), expected, atol=1e-6, rtol=0)
