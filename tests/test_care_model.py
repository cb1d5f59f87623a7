"""CARE asymmetric retrieval (medadapt.care): towers, losses, stages, save/load, LoRA placement.

Every model is tiny and random, built offline: the BERT query tower comes from ``conftest.py``, the Qwen2
decoder document tower from :func:`medadapt.tiny.build_tiny_qwen2` (BPE tokenizer trained on the fly).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from _helpers import doc_tower
from conftest import corpus_texts
from medadapt.errors import ConfigError, DataError

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture()
def asym(tiny_bert, tiny_qwen2_dir):
    from medadapt.care import build_asymmetric_model

    return build_asymmetric_model(tiny_bert, doc_tower(tiny_qwen2_dir))


def snapshot(modules) -> dict[str, torch.Tensor]:
    return {f"{i}.{k}": v.detach().clone() for i, m in enumerate(modules) for k, v in m.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------ EOS pooling
def test_append_eos_right_and_left_padding():
    from medadapt.care import append_eos

    eos, pad = 9, 0
    right = torch.tensor([[5, 6, 7], [5, 0, 0]]), torch.tensor([[1, 1, 1], [1, 0, 0]])
    ids, mask = append_eos(*right, eos, pad)
    assert ids.tolist() == [[5, 6, 7, 9], [5, 9, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    left = torch.tensor([[5, 6, 7], [0, 0, 5]]), torch.tensor([[1, 1, 1], [0, 0, 1]])
    ids, mask = append_eos(*left, eos, pad)
    assert ids.tolist() == [[5, 6, 7, 9], [0, 0, 5, 9]]
    assert mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    # an existing trailing EOS is not doubled; a column nobody needs is dropped
    ids, mask = append_eos(torch.tensor([[5, 9, 0]]), torch.tensor([[1, 1, 0]]), eos, pad)
    assert ids.tolist() == [[5, 9, 0]] and mask.tolist() == [[1, 1, 0]]


@pytest.mark.parametrize("side", ["left", "right"])
def test_eos_pooling_picks_last_non_pad_token(tiny_qwen2_dir, side):
    model = doc_tower(tiny_qwen2_dir, side)
    transformer = model[0]
    eos = transformer.tokenizer.eos_token_id
    texts = ["diabetes insulin glucose thirst and more words here", "gout", "asthma inhaler"]
    features = model.preprocess(texts, task="document")
    ids, mask = features["input_ids"], features["attention_mask"]
    lengths = mask.sum(1)
    for row in range(len(texts)):
        valid = ids[row][mask[row].bool()]
        assert valid[-1].item() == eos and (valid[:-1] != eos).all()
        assert bool(mask[row, -1]) == (side == "left" or lengths[row] == lengths.max())
    with torch.no_grad():
        out = model(dict(features))
    last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
    expected = out["token_embeddings"][torch.arange(len(texts)), last]
    torch.testing.assert_close(out["sentence_embedding"], torch.nn.functional.normalize(expected, dim=-1))
    batched = model.encode_document(texts, convert_to_tensor=True)
    single = torch.stack([model.encode_document([t], convert_to_tensor=True)[0] for t in texts])
    torch.testing.assert_close(batched, single, atol=1e-4, rtol=1e-4)


def test_eos_fits_in_max_seq_length(tiny_qwen2_dir):
    model = doc_tower(tiny_qwen2_dir, "right")
    model.max_seq_length = 8
    features = model.preprocess([" ".join(corpus_texts())], task="document")
    assert features["input_ids"].shape[1] == 8
    assert features["input_ids"][0, -1].item() == model[0].tokenizer.eos_token_id


# ------------------------------------------------------------------------------------------ MRL
def test_matryoshka_loss_averages_nested_dims():
    from medadapt.losses import InfoNCELoss, MatryoshkaLoss

    torch.manual_seed(0)
    q, p, n = torch.randn(6, 16), torch.randn(6, 16), torch.randn(6, 2, 16)
    base = InfoNCELoss(0.1)
    mrl = MatryoshkaLoss(base, dims=[16, 4, 8])
    assert mrl.dims == [4, 8, 16]
    expected = sum(base(q[:, :d], p[:, :d], n[:, :, :d])["infonce"] for d in (4, 8, 16)) / 3
    torch.testing.assert_close(mrl(q, p, n)["infonce"], expected)
    assert set(mrl.last_per_dim) == {4, 8, 16}
    with pytest.raises(ValueError, match="exceeds"):
        MatryoshkaLoss(base, dims=[32])(q, p)
    weighted = MatryoshkaLoss(base, dims=[16, 4], weights=[3, 1])  # weights follow their dims when sorted
    expected = 0.75 * base(q, p, n)["infonce"] + 0.25 * base(q[:, :4], p[:, :4], n[:, :, :4])["infonce"]
    torch.testing.assert_close(weighted(q, p, n)["infonce"], expected)


def test_mrl_truncation_to_query_dimension(asym, tmp_path):
    from medadapt.care import MatryoshkaTruncate, route_modules

    doc_route = route_modules(asym, "document")
    assert isinstance(doc_route[-1], MatryoshkaTruncate) and doc_route[-1].dim == 32  # 48-d Qwen2 -> 32-d BERT
    q = asym.encode_query(["what is gout"])
    d = asym.encode_document(["gout is a condition"])
    assert q.shape == d.shape == (1, 32)
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0, rtol=1e-5)


def test_projection_variant_maps_query_to_document_dim(tiny_bert, tiny_qwen2_dir):
    from medadapt.care import MatryoshkaTruncate, build_asymmetric_model, route_modules

    model = build_asymmetric_model(tiny_bert, doc_tower(tiny_qwen2_dir), projection=True)
    assert not any(isinstance(m, MatryoshkaTruncate) for m in route_modules(model, "document"))
    assert model.encode_query(["gout"]).shape == model.encode_document(["gout"]).shape == (1, 48)


# ------------------------------------------------------------------------------------------ losses
def test_asym_infonce_and_alignment_loss():
    from medadapt.care import QueryAlignmentLoss
    from medadapt.losses import AsymInfoNCELoss

    torch.manual_seed(0)
    t = torch.randn(8, 16)
    loss = AsymInfoNCELoss(0.05)
    assert loss(t, t)["asym_infonce"] < 1e-3 < loss(torch.randn(8, 16), t)["asym_infonce"]
    with pytest.raises(ValueError, match="truncate"):
        loss(torch.randn(8, 16), torch.randn(8, 32))
    parts = QueryAlignmentLoss(0.05, contrastive_weight=1.0, mse_weight=2.0)(t * 3, t)
    assert set(parts) == {"asym_infonce", "mse"} and parts["mse"] < 1e-6
    assert set(QueryAlignmentLoss(mse_weight=0.0)(t, t)) == {"asym_infonce"}
    assert set(QueryAlignmentLoss(contrastive_weight=0.0)(t, t)) == {"mse"}
    with pytest.raises(ConfigError):
        QueryAlignmentLoss(contrastive_weight=0.0, mse_weight=0.0)


def test_rank_distillation_against_hand_computation():
    import torch.nn.functional as F

    from medadapt.care import QueryAlignmentLoss

    torch.manual_seed(0)
    docs, teacher, student = torch.randn(7, 4), torch.randn(3, 4), torch.randn(3, 4)
    parts = QueryAlignmentLoss(0.05, contrastive_weight=0.0, mse_weight=0.0, documents=docs * 5,
                               distill_weight=2.0, distill_temperature=0.1)(student * 3, teacher)
    assert set(parts) == {"rank_kl"}
    # by hand: softmax over cos(text, document) / 0.1, KL(teacher || student) summed over documents,
    # mean over texts
    cos_s = F.normalize(student, dim=-1) @ F.normalize(docs, dim=-1).T
    cos_t = F.normalize(teacher, dim=-1) @ F.normalize(docs, dim=-1).T
    kl = 0.0
    for i in range(3):
        p_t = [math.exp(c / 0.1) for c in cos_t[i].tolist()]
        p_s = [math.exp(c / 0.1) for c in cos_s[i].tolist()]
        p_t, p_s = [x / sum(p_t) for x in p_t], [x / sum(p_s) for x in p_s]
        kl += sum(a * math.log(a / b) for a, b in zip(p_t, p_s)) / 3
    assert float(parts["rank_kl"]) == pytest.approx(2.0 * kl, rel=1e-5)
    same_ranking = QueryAlignmentLoss(documents=docs, distill_weight=1.0)(teacher * 2, teacher)
    assert float(same_ranking["rank_kl"]) == pytest.approx(0.0, abs=1e-6)  # only the direction counts
    assert set(same_ranking) == {"asym_infonce", "mse", "rank_kl"}
    with pytest.raises(ConfigError, match="distill_weight > 0 needs documents"):
        QueryAlignmentLoss(distill_weight=1.0)
    with pytest.raises(ConfigError, match="not all 0"):
        QueryAlignmentLoss(contrastive_weight=0.0, mse_weight=0.0, documents=docs)


# ------------------------------------------------------------------------------------------ stages
def _alignment_loss(model, texts, teacher) -> float:
    from medadapt.care import QueryAlignmentLoss, tower

    with torch.no_grad():
        student = torch.from_numpy(tower(model, "query").encode_query(texts))
    return float(sum(QueryAlignmentLoss()(student, teacher).values()))


def test_stage1_updates_query_tower_only_and_aligns_it(asym):
    from medadapt.care import CarePhaseSection, align_queries, route_modules, tower

    texts = corpus_texts()
    teacher = torch.from_numpy(tower(asym, "document").encode_document(texts))
    before_doc = snapshot(route_modules(asym, "document"))
    before_loss = _alignment_loss(asym, texts, teacher)
    flags = [p.requires_grad for p in asym.parameters()]
    result = align_queries(asym, texts, teacher, CarePhaseSection(epochs=4, batch_size=8, lr=1e-3), seed=0)
    assert result.steps == 12 and result.stage_steps == {"stage1": 12}
    assert set(result.loss_history[0]) == {"stage", "step", "epoch", "loss", "asym_infonce", "mse", "lr"}
    assert same(before_doc, snapshot(route_modules(asym, "document")))  # the document tower is frozen
    assert _alignment_loss(asym, texts, teacher) < 0.8 * before_loss  # the query tower moved onto the teacher
    assert flags == [p.requires_grad for p in asym.parameters()]  # requires_grad restored


def test_phase_section_is_the_loops_optim_section_with_care_defaults():
    from medadapt.care import CarePhaseSection
    from medadapt.training.config import OptimSection

    section = CarePhaseSection()
    assert isinstance(section, OptimSection)
    assert (section.lr, section.warmup_ratio, section.batch_size, section.scheduler) == (1e-4, 0.05, 32, "cosine")
    with pytest.raises(ValueError, match="lr"):
        CarePhaseSection(lr=0)


def test_lora_lands_on_document_tower_and_stage2_trains_it(asym):
    from medadapt.care import (CarePhaseSection, TrainPair, attach_document_lora, has_lora, joint_finetune,
                               route_modules)
    from medadapt.recipes.base import LoraSection

    attach_document_lora(asym, LoraSection(r=4, alpha=8))
    q_route, d_route = route_modules(asym, "query"), route_modules(asym, "document")
    assert has_lora(d_route[0]) and not any(has_lora(m) for m in q_route)
    lora_names = [n for n, _ in asym.named_parameters() if "lora_" in n]
    assert lora_names and all(n.startswith("0.sub_modules.document.") for n in lora_names)
    base_before = {n: p.detach().clone() for n, p in d_route[0].named_parameters() if "lora_" not in n}
    lora_b_before = {n: p.detach().clone() for n, p in d_route[0].named_parameters() if "lora_B" in n}
    texts = corpus_texts()
    pairs = [TrainPair(texts[i], i ^ 1, [(i + 4) % len(texts)]) for i in range(len(texts))]
    result = joint_finetune(asym, pairs, texts, CarePhaseSection(epochs=1, batch_size=6, lr=1e-2))
    assert result.steps == 4
    for n, p in d_route[0].named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base_before[n]), n  # the LLM's own weights stay frozen
    assert any(not torch.equal(p, lora_b_before[n]) for n, p in d_route[0].named_parameters() if "lora_B" in n)


def test_stage2_with_frozen_document_table(asym):
    from medadapt.care import CarePhaseSection, TrainPair, joint_finetune, route_modules, tower

    texts = corpus_texts()
    table = torch.from_numpy(tower(asym, "document").encode_document(texts))
    before = snapshot(route_modules(asym, "document"))
    before_q = snapshot(route_modules(asym, "query"))
    pairs = [TrainPair(texts[i], i ^ 1, [(i + 2) % len(texts)]) for i in range(len(texts))]
    joint_finetune(asym, pairs, texts, CarePhaseSection(batch_size=8), train_document=False, doc_table=table)
    assert same(before, snapshot(route_modules(asym, "document")))
    assert not same(before_q, snapshot(route_modules(asym, "query")))
    with pytest.raises(ConfigError, match="doc_table"):
        joint_finetune(asym, pairs, texts, CarePhaseSection(batch_size=8), train_document=False)


def test_stage1_rank_distillation_teaches_the_teachers_ranking(asym):
    from medadapt.care import CarePhaseSection, QueryAlignmentLoss, align_queries, route_modules, tower

    texts = corpus_texts()
    docs = texts[::2]  # the documents of the tiny corpus, ranked for every text
    teacher = torch.from_numpy(tower(asym, "document").encode_document(texts))
    table = torch.from_numpy(tower(asym, "document").encode_document(docs))
    loss = QueryAlignmentLoss(contrastive_weight=0.0, mse_weight=0.0, documents=table, distill_weight=1.0,
                              distill_temperature=0.05)

    def rank_kl() -> float:
        with torch.no_grad():
            student = torch.from_numpy(tower(asym, "query").encode_query(texts))
        return float(loss(student, teacher)["rank_kl"])

    before_doc, before = snapshot(route_modules(asym, "document")), rank_kl()
    section = CarePhaseSection(epochs=4, batch_size=8, lr=1e-3)
    result = align_queries(asym, texts, teacher, section, loss, seed=0)
    assert set(result.loss_history[-1]) == {"stage", "step", "epoch", "loss", "rank_kl", "lr"}
    assert rank_kl() < 0.5 * before  # the query tower now ranks the corpus as the document tower does
    assert same(before_doc, snapshot(route_modules(asym, "document")))


@pytest.fixture()
def asym_no_dropout(tiny_bert_dir, tiny_qwen2_dir, tmp_path):
    """The asymmetric model with dropout off in the BERT query tower (Qwen2 has none), so that two runs that
    chunk a batch differently draw no different masks."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    from medadapt.care import build_asymmetric_model

    bert = tmp_path / "bert"
    shutil.copytree(tiny_bert_dir, bert)
    config = json.loads((bert / "config.json").read_text())
    config.update({k: 0.0 for k in config if k.endswith("dropout_prob")})
    (bert / "config.json").write_text(json.dumps(config))

    def build():
        return build_asymmetric_model(SentenceTransformer(str(bert), device="cpu"), doc_tower(tiny_qwen2_dir))

    return build


@pytest.mark.parametrize("train_document", [False, True])
def test_stage2_accumulation_equals_the_large_batch(asym_no_dropout, train_document):
    """4 chunks of 3 pairs (GradCache) train exactly as one batch of 12: in-batch and hard negatives of the
    whole optimiser step reach every query (the loop gathers the steps' per-item embeddings)."""
    from medadapt.care import CarePhaseSection, TrainPair, joint_finetune, route_modules, tower

    texts = corpus_texts()
    pairs = [TrainPair(texts[i], i ^ 1, [(i + 2) % len(texts), (i + 5) % len(texts)]) for i in range(len(texts))]
    runs = []
    for section in (CarePhaseSection(epochs=2, batch_size=12, lr=1e-3, warmup_ratio=0.0),
                    CarePhaseSection(epochs=2, batch_size=3, gradient_accumulation_steps=4, lr=1e-3,
                                     warmup_ratio=0.0)):
        model = asym_no_dropout()
        table = torch.from_numpy(tower(model, "document").encode_document(texts))
        res = joint_finetune(model, pairs, texts, section, train_document=train_document, doc_table=table, seed=1)
        runs.append((res, snapshot(route_modules(model, "query"))))
    (big, big_q), (acc, acc_q) = runs
    assert big.steps == acc.steps == 4
    assert [r["loss"] for r in acc.loss_history] == pytest.approx([r["loss"] for r in big.loss_history], abs=1e-5)
    for k in big_q:
        torch.testing.assert_close(acc_q[k], big_q[k], atol=1e-5, rtol=1e-4)
    # and a plain small batch would have trained differently
    small = joint_finetune(asym_no_dropout(), pairs, texts, CarePhaseSection(epochs=2, batch_size=3, lr=1e-3),
                           train_document=train_document, doc_table=table, seed=1)
    assert small.loss_history[0]["loss"] != pytest.approx(big.loss_history[0]["loss"], abs=1e-3)


def test_stage_resumes_from_checkpoint(asym, tmp_path):
    from medadapt.care import CarePhaseSection, align_queries, route_modules, tower
    from medadapt.training.checkpoint import CheckpointConfig, latest_checkpoint
    from medadapt.training.loop import TrainingError

    texts = corpus_texts()
    teacher = torch.from_numpy(tower(asym, "document").encode_document(texts))
    ck = CheckpointConfig(tmp_path / "ck", every_steps=2)
    section = CarePhaseSection(epochs=1, batch_size=8)
    full = align_queries(asym, texts, teacher, section, checkpoint=ck, fingerprint="run-a")
    assert latest_checkpoint(ck.directory).name == "step-00000003"
    state = snapshot(route_modules(asym, "query"))
    again = align_queries(asym, texts, teacher, section, checkpoint=ck, fingerprint="run-a")
    assert again.loss_history == full.loss_history and again.steps == 3
    assert same(state, snapshot(route_modules(asym, "query")))
    with pytest.raises(TrainingError, match="another run"):
        align_queries(asym, texts, teacher, section, checkpoint=ck, fingerprint="run-b")


def test_phases_refuse_empty_data(asym):
    from medadapt.care import CarePhaseSection, align_queries, joint_finetune

    with pytest.raises(ConfigError, match="no training items"):
        joint_finetune(asym, [], [], CarePhaseSection())
    with pytest.raises(ConfigError, match="no training items"):
        align_queries(asym, [], torch.zeros(0, 32), CarePhaseSection())


# ------------------------------------------------------------------------------------------ towers
def test_pruned_and_static_query_towers(tiny_bert, tmp_path):
    from sentence_transformers import SentenceTransformer

    from medadapt.care import build_asymmetric_model, prune_layers, static_from_document

    pruned = prune_layers(tiny_bert, 1)
    assert pruned[0].auto_model.config.num_hidden_layers == 1 and len(pruned[0].auto_model.encoder.layer) == 1
    assert len(tiny_bert[0].auto_model.encoder.layer) == 2  # the document tower is untouched
    static = static_from_document(tiny_bert, corpus_texts())
    assert static.get_embedding_dimension() == 32
    model = build_asymmetric_model([static], tiny_bert)
    q = model.encode_query(["symptoms of gout"])
    assert q.shape == (1, 32) and np.isfinite(q).all()
    model.save(str(tmp_path / "static"))
    loaded = SentenceTransformer(str(tmp_path / "static"), device="cpu", trust_remote_code=True)
    np.testing.assert_array_equal(loaded.encode_query(["symptoms of gout"]), q)


def test_save_load_reproduces_encodings_exactly(asym, tmp_path):
    from sentence_transformers import SentenceTransformer

    from medadapt.care import EosTransformer, attach_document_lora, merge_document_lora, route_modules
    from medadapt.models import load
    from medadapt.recipes.base import LoraSection

    asym.prompts = {"query": "query: "}
    attach_document_lora(asym, LoraSection(r=4, alpha=8))
    with torch.no_grad():
        for n, p in asym.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)  # a non-trivial adapter
    assert merge_document_lora(asym)
    texts = corpus_texts()
    q, d = asym.encode_query(texts), asym.encode_document(texts)
    asym.save(str(tmp_path / "m"))
    for loaded in (SentenceTransformer(str(tmp_path / "m"), device="cpu", trust_remote_code=True),
                   load(str(tmp_path / "m"), device="cpu")):
        assert isinstance(route_modules(loaded, "document")[0], EosTransformer)
        np.testing.assert_array_equal(loaded.encode_query(texts), q)
        np.testing.assert_array_equal(loaded.encode_document(texts), d)


def test_folders_saved_under_the_old_asym_package_name_still_open(asym, tmp_path):
    """Folders written before ``medadapt.asym`` became ``medadapt.care`` name the old module paths."""
    from medadapt.models import load

    texts = corpus_texts()
    q, d = asym.encode_query(texts), asym.encode_document(texts)
    asym.save(str(tmp_path / "m"))
    rewritten = 0
    for f in (tmp_path / "m").rglob("*.json"):
        text = f.read_text()
        old = text.replace("medadapt.decoder.EosTransformer", "medadapt.asym.decoder.EosTransformer")
        rewritten += old != text
        f.write_text(old)
    assert rewritten  # the folder really names the old path now
    loaded = load(str(tmp_path / "m"), device="cpu")
    np.testing.assert_array_equal(loaded.encode_query(texts), q)
    np.testing.assert_array_equal(loaded.encode_document(texts), d)


def test_evaluate_asymmetric_reuses_standalone_document_cache(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from medadapt.care import build_asymmetric_model, evaluate_asymmetric, prune_layers, tower
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval

    data = load_beir(tiny_beir_dir, ["test"])
    cache = EmbeddingCache(tmp_path / "cache")
    document = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    cache.encode(document, data.doc_texts(), role="document", show_progress=False)
    model = build_asymmetric_model(prune_layers(document, 1), document)
    assert cache.count_missing(tower(model, "document"), data.doc_texts(), role="document") == 0
    metrics = evaluate_asymmetric(model, data, "test", ["ndcg@10", "recall@10"], cache=cache)
    # the cached standalone document embeddings score exactly as encoding through the model's routes
    direct = evaluate_retrieval(model, data, "test", ["ndcg@10", "recall@10"],
                                cache=EmbeddingCache(tmp_path / "fresh"), show_progress=False)
    assert metrics == pytest.approx(direct, abs=1e-6)


def test_sentence_transformers_trainer_with_router_mapping(tiny_bert, tmp_path):
    """The asymmetric model is a plain Router model: ST's trainer routes columns with ``router_mapping``."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from medadapt.care import build_asymmetric_model, prune_layers, route_modules

    model = build_asymmetric_model(prune_layers(tiny_bert, 1), tiny_bert)
    texts = corpus_texts()
    before = snapshot(route_modules(model, "query"))
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "st"), num_train_epochs=1, per_device_train_batch_size=4, use_cpu=True,
        router_mapping={"question": "query", "positive": "document"}, report_to=[], save_strategy="no")
    data = Dataset.from_dict({"question": texts[1::2], "positive": texts[0::2]})
    SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                               loss=MultipleNegativesRankingLoss(model)).train()
    assert not same(before, snapshot(route_modules(model, "query")))


def test_query_speed_reports_throughput_and_latency():
    from medadapt.care import query_speed

    speed = query_speed(lambda batch: [len(t) for t in batch], ["a", "bb", "ccc"] * 10, batch_size=4,
                        latency_samples=5)
    assert speed["qps"] > 0 and 0 <= speed["p50_ms"] <= speed["p90_ms"]


def test_mined_pairs_query_encoder_mines_with_its_own_query_embeddings(tiny_beir_dir):
    """``query_encoder`` replaces the document model for the query side of the mining only: with one-hot
    embeddings the hard negative of train query i is the document its query vector points at, d(i+1) when
    the document model encodes queries, d(i+2) with the other encoder; the corpus side is the same."""
    from medadapt.care.data import mined_pairs
    from medadapt.data import load_beir

    data = load_beir(tiny_beir_dir)
    n = len(data.doc_ids)
    document, other = object(), object()
    shift = {id(document): 1, id(other): 2}

    class OneHotCache:
        def encode(self, model, texts, role, **_):
            if role == "document":
                return np.eye(n, dtype=np.float32)[[data.doc_texts().index(t) for t in texts]]
            rows = [(int(qid_of[t][1:]) + shift[id(model)]) % n for t in texts]
            return np.eye(n, dtype=np.float32)[rows]

    qid_of = {data.queries[q]: q for q in data.qrels["train"]}
    default = mined_pairs(data, "train", None, 1, 0, 10, document, OneHotCache())
    mined = mined_pairs(data, "train", None, 1, 0, 10, document, OneHotCache(), query_encoder=other)
    for plain, other_pair in zip(default, mined):
        i = int(qid_of[plain.query][1:])
        assert data.doc_ids[plain.positive] == f"d{i}" == data.doc_ids[other_pair.positive]
        assert plain.negatives == [data.doc_ids.index(f"d{(i + 1) % n}")]
        assert other_pair.negatives == [data.doc_ids.index(f"d{(i + 2) % n}")]


# ------------------------------------------------------------------------- stage II with alignment replay
def test_align_replay_rows_depend_on_item_and_epoch_only():
    from medadapt.care import AlignReplay, QueryAlignmentLoss

    replay = AlignReplay([f"t{i}" for i in range(10)], torch.zeros(10, 4), QueryAlignmentLoss(), 1.0)
    whole = replay.rows(list(range(12)), seed=3, epoch=0)
    assert replay.rows(list(range(6)), 3, 0) + replay.rows(list(range(6, 12)), 3, 0) == whole  # any sharding
    assert sorted(whole[:10]) == list(range(10)) and whole[10:] == whole[:2]  # a permutation, then wraps
    assert replay.rows(list(range(10)), 3, 1) != whole[:10]  # the next epoch walks another order
    assert replay.rows(list(range(10)), 3, 0) == whole[:10]  # and coming back to epoch 0 repeats it
    with pytest.raises(ValueError, match="3 replay texts but 10"):
        AlignReplay(["a", "b", "c"], torch.zeros(10, 4), QueryAlignmentLoss(), 1.0)


def test_stage2_align_replay_adds_weighted_alignment_and_keeps_the_tower_on_the_teacher(asym_no_dropout):
    """The stage-II step's parts are eq. 4 plus ``w x`` eq. 3 on the replayed texts (checked against a hand
    computation); trained with the replay, the query tower ends nearer the teacher than without it."""
    import torch.nn.functional as F

    from medadapt.care import (AlignReplay, CarePhaseSection, QueryAlignmentLoss, TrainPair, joint_finetune,
                               joint_stage, tower)
    from medadapt.training.loop import Batch

    texts = corpus_texts()
    pairs = [TrainPair(texts[i], i ^ 1, [(i + 2) % len(texts)]) for i in range(len(texts))]
    model = asym_no_dropout()
    table = torch.from_numpy(tower(model, "document").encode_document(texts))
    teacher = torch.from_numpy(tower(model, "document").encode_query(texts))
    replay = AlignReplay(texts, teacher, QueryAlignmentLoss(temperature=0.05, mse_weight=1.0), 0.5)
    stage = joint_stage(model, pairs, texts, CarePhaseSection(batch_size=4), train_document=False,
                        doc_table=table, align=replay)
    batch = Batch(indices=[0, 1, 2, 3], all_indices=[0, 1, 2, 3], step=0, epoch=0, seed=7)
    with torch.no_grad():
        parts = stage.step.loss(stage.step.forward(model, batch), batch)
        rows = replay.rows([0, 1, 2, 3], 7, 0)
        encode = tower(model, "query").encode_query
        q = F.normalize(torch.from_numpy(encode([texts[i] for i in range(4)])), dim=-1)
        s = F.normalize(torch.from_numpy(encode([texts[r] for r in rows])), dim=-1)
    t = F.normalize(teacher[rows], dim=-1)
    docs = F.normalize(table, dim=-1)
    pos, neg = docs[[i ^ 1 for i in range(4)]], docs[[(i + 2) % len(texts) for i in range(4)]]
    logits = torch.cat([q @ pos.T, q @ neg.T], dim=1) / 0.05  # in-batch positives + every hard negative
    assert float(parts["asym_infonce"]) == pytest.approx(float(F.cross_entropy(logits, torch.arange(4))), abs=1e-4)
    assert float(parts["align_mse"]) == pytest.approx(0.5 * float((s - t).pow(2).sum(-1).mean()), abs=1e-5)
    align_nce = F.cross_entropy(s @ t.T / 0.05, torch.arange(4))
    assert float(parts["align_asym_infonce"]) == pytest.approx(0.5 * float(align_nce), abs=1e-4)

    section = CarePhaseSection(epochs=6, batch_size=6, lr=3e-3, warmup_ratio=0.0)
    drift = {}
    for weight in (0.0, 2.0):
        m = asym_no_dropout()
        res = joint_finetune(m, pairs, texts, section, train_document=False, doc_table=table, seed=1,
                             align=AlignReplay(texts, teacher, QueryAlignmentLoss(), weight) if weight else None)
        assert ("align_mse" in res.loss_history[-1]) == bool(weight)
        drift[weight] = _alignment_loss(m, texts, teacher)
    assert drift[2.0] < 0.8 * drift[0.0]


# ------------------------------------------------------------------------------- stage I on corpus sentences
def test_corpus_sentences_split_join_short_pieces_and_keep_every_word():
    from medadapt.care.data import corpus_sentences

    text = "Gout is a form of arthritis. It hurts!  Treatment includes NSAIDs; rest helps too? Yes."
    out = corpus_sentences(text)
    assert out == ["Gout is a form of arthritis.", "It hurts! Treatment includes NSAIDs;", "rest helps too? Yes."]
    assert " ".join(out).split() == text.split()  # nothing lost, nothing added
    zh = "痛风是一种关节炎。多发于中年男性。治疗包括休息、药物以及饮食控制。"
    assert corpus_sentences(zh, min_chars=10) == ["痛风是一种关节炎。多发于中年男性。", "治疗包括休息、药物以及饮食控制。"]
    assert corpus_sentences("Short.") == ["Short."] and corpus_sentences("  ") == []


def test_self_contrastive_texts_on_corpus_sentences(tmp_path):
    from conftest import write_beir

    from medadapt.care import self_contrastive_texts
    from medadapt.data import load_beir

    root = write_beir(tmp_path / "b", {"d0": ("Gout", "Gout is a form of arthritis. It often starts in the toe."),
                                       "d1": ("Flu", "Gout is a form of arthritis. Influenza spreads by droplets.")},
                      {"q0": "what is gout", "q1": "flu spread"}, {"train": {"q0": {"d0": 1}, "q1": {"d1": 1}}})
    data = load_beir(root, ["train"])
    docs = self_contrastive_texts(data, ["train"])
    assert sorted(docs) == sorted([("what is gout", "query"), ("flu spread", "query"),
                                   (data.doc_texts()[0], "document"), (data.doc_texts()[1], "document")])
    sents = self_contrastive_texts(data, ["train"], corpus_units="sentences")
    assert sorted(t for t, _ in sents) == sorted(["what is gout", "flu spread", "Gout is a form of arthritis.",
                                                  "It often starts in the toe.", "Influenza spreads by droplets."])
    assert {r for _, r in sents} == {"query"}  # the teacher embeds the sentences as the query tower is used
    with pytest.raises(DataError, match="corpus_units 'pages'"):
        self_contrastive_texts(data, ["train"], corpus_units="pages")
