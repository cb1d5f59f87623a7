"""CARE's query-tower initialisation (Appendix C.1.1): RetroMAE pre-training (medadapt.training.retromae),
unsupervised InfoNCE with a learnable temperature (medadapt.losses.LearnableTemperatureInfoNCELoss), and the
recipe schema / runner / planner that chain them before the supervised fine-tuning
(recipes/care-tiny-init.yaml end to end). Tiny random models only (conftest.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import corpus_texts

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("_single_thread")]

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
QUIET = {"show_progress": False, "log": lambda m: None}


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------------------------ RetroMAE
def test_retromae_loss_decreases_and_only_the_encoder_changes(tiny_bert, tmp_path):
    from sentence_transformers import SentenceTransformer

    from medadapt.training.retromae import RetroMAESection, pretrain_retromae

    before = _weights(tiny_bert)
    modules_before = [type(m).__name__ for m in tiny_bert._modules.values()]
    section = RetroMAESection(epochs=10, batch_size=8, lr=2e-3, warmup_ratio=0.0, encoder_mask_ratio=0.3,
                              decoder_mask_ratio=0.6)
    res = pretrain_retromae(tiny_bert, corpus_texts() * 4, section, seed=0)
    hist = res.loss_history
    assert res.steps == len(hist) == 10 * 12  # 96 texts / 8 per step, 10 epochs
    assert {"mlm_encoder", "mlm_decoder"} <= set(hist[0])
    assert hist[0]["loss"] == pytest.approx(hist[0]["mlm_encoder"] + hist[0]["mlm_decoder"], rel=1e-6)
    # random init predicts ~uniformly: ln(vocab) per token on each side; training lowers both sides
    vocab = tiny_bert[0].model.config.vocab_size
    assert hist[0]["mlm_encoder"] == pytest.approx(math.log(vocab), rel=0.1)
    first = sum(r["loss"] for r in hist[:5]) / 5
    last = sum(r["loss"] for r in hist[-5:]) / 5
    assert last < first - 2.0  # measured: ~10.0 -> ~6.1
    assert sum(r["mlm_decoder"] for r in hist[-5:]) / 5 < sum(r["mlm_decoder"] for r in hist[:5]) / 5 - 1.0

    # only the encoder's weights changed; no decoder / MLM head was left on the model
    after = _weights(tiny_bert)
    assert set(after) == set(before)
    assert [type(m).__name__ for m in tiny_bert._modules.values()] == modules_before
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("0.") for k in changed)  # module 0: the Transformer
    assert any("word_embeddings" in k for k in changed)  # tied to the MLM head: trained through it too
    assert all(p.requires_grad for p in tiny_bert.parameters())  # flags restored
    # the model still saves, loads and encodes the same
    tiny_bert.save(str(tmp_path / "m"))
    again = SentenceTransformer(str(tmp_path / "m"), device="cpu")
    texts = ["gout attack", "asthma inhaler"]
    assert again.encode(texts) == pytest.approx(tiny_bert.encode(texts), abs=1e-5)


def test_retromae_loss_is_the_mean_token_cross_entropy_of_both_sides():
    from medadapt.training.retromae import RetroMAEStep, _mlm_sums

    torch.manual_seed(0)
    head = torch.nn.Linear(4, 7)
    hidden = torch.randn(2, 3, 4)
    labels = torch.tensor([[2, -100, 5], [-100, -100, 1]])
    sums, counts = _mlm_sums(head, hidden, labels)
    logits = head(hidden)
    ce = torch.nn.functional.cross_entropy
    assert counts.tolist() == [2.0, 1.0]
    assert sums[0].item() == pytest.approx((ce(logits[0, 0:1], labels[0, 0:1]) + ce(logits[0, 2:3], labels[0, 2:3])).item(),
                                           rel=1e-5)
    assert sums[1].item() == pytest.approx(ce(logits[1, 2:3], labels[1, 2:3]).item(), rel=1e-5)
    # the step's loss: token-weighted means over the whole optimiser step (not a mean of per-text means)
    out = {"encoder_sum": torch.tensor([3.0, 1.0]), "encoder_count": torch.tensor([2.0, 2.0]),
           "decoder_sum": torch.tensor([6.0, 0.0]), "decoder_count": torch.tensor([3.0, 0.0])}
    parts = RetroMAEStep.loss(None, out, None)  # type: ignore[arg-type]
    assert parts["mlm_encoder"].item() == pytest.approx(1.0) and parts["mlm_decoder"].item() == pytest.approx(2.0)


def test_retromae_section_rejects_bad_ratios():
    from pydantic import ValidationError

    from medadapt.training.retromae import RetroMAESection

    with pytest.raises(ValidationError, match="encoder_mask_ratio"):
        RetroMAESection(encoder_mask_ratio=1.2)
    with pytest.raises(ValidationError, match="must be >= encoder_mask_ratio"):
        RetroMAESection(encoder_mask_ratio=0.5, decoder_mask_ratio=0.3)


# ------------------------------------------------------------------------------------------------ temperature
def test_learnable_temperature_loss_value_gradient_and_positivity():
    import torch.nn.functional as F

    from medadapt.errors import ConfigError
    from medadapt.losses import LearnableTemperatureInfoNCELoss

    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    b = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    loss = LearnableTemperatureInfoNCELoss(temperature=0.5)
    parts = loss(a, b)
    # hand-computed: cosines [[1/sqrt2, 0], [1/sqrt2, 1]] / 0.5
    c = 1 / math.sqrt(2)
    row0 = -math.log(math.exp(c / 0.5) / (math.exp(c / 0.5) + math.exp(0.0)))
    row1 = -math.log(math.exp(1 / 0.5) / (math.exp(c / 0.5) + math.exp(1 / 0.5)))
    assert parts["loss"].item() == pytest.approx((row0 + row1) / 2, rel=1e-5)
    assert parts["temperature"].item() == pytest.approx(0.5)
    assert loss.log_temperature.shape == (1,)  # not 0-dim: FSDP / DeepSpeed ZeRO refuse scalar parameters
    parts["loss"].backward()
    assert loss.log_temperature.grad is not None and loss.log_temperature.grad.item() != 0
    # symmetric = mean of both directions
    sym = LearnableTemperatureInfoNCELoss(temperature=0.5, symmetric=True)(a, b)["loss"].item()
    other = F.cross_entropy(F.normalize(b, dim=-1) @ F.normalize(a, dim=-1).T / 0.5, torch.arange(2)).item()
    assert sym == pytest.approx(((row0 + row1) / 2 + other) / 2, rel=1e-5)
    # log-parametrised and clamped: whatever the parameter, the temperature is >= min_temperature > 0
    with torch.no_grad():
        loss.log_temperature.fill_(-1e4)
    assert loss.temperature == pytest.approx(0.01) and loss(a, b)["temperature"].item() > 0
    assert torch.isfinite(loss(a, b)["loss"])
    with pytest.raises(ConfigError, match="must not exceed"):
        LearnableTemperatureInfoNCELoss(temperature=0.01, min_temperature=0.05)
    with pytest.raises(ConfigError, match="> 0"):
        LearnableTemperatureInfoNCELoss(temperature=0.0)


def test_unsupervised_stage_learns_the_temperature_with_the_tower(tiny_bert):
    from medadapt.care.stages import CarePhaseSection, trainable_only, unsupervised_stage
    from medadapt.losses import LearnableTemperatureInfoNCELoss
    from medadapt.training.loop import train

    texts = corpus_texts()
    pairs = [(t.split(" is ")[0], t) for t in texts] + [(t, t) for t in texts]  # title-like + dropout views
    loss = LearnableTemperatureInfoNCELoss(temperature=0.05)
    before = _weights(tiny_bert)
    module, stage = unsupervised_stage(tiny_bert, pairs, CarePhaseSection(epochs=3, batch_size=8, lr=5e-2,
                                                                          warmup_ratio=0.0), loss)
    assert any(p is loss.log_temperature for p in stage.params)
    with trainable_only(module, stage.params):
        res = train(module, [stage], seed=0)
    temps = [r["temperature"] for r in res.loss_history]
    assert len(temps) == 3 * len(pairs) // 8 and all(t > 0 for t in temps)
    assert abs(loss.temperature - 0.05) > 1e-3  # it moved
    assert temps[-1] == pytest.approx(loss.temperature, rel=0.2)
    assert any(not torch.equal(before[k], v) for k, v in _weights(tiny_bert).items())
    # a frozen temperature stays put
    frozen = LearnableTemperatureInfoNCELoss(temperature=0.05, learnable=False)
    module, stage = unsupervised_stage(tiny_bert, pairs, CarePhaseSection(epochs=1, batch_size=8, lr=5e-2), frozen)
    with trainable_only(module, stage.params):
        train(module, [stage], seed=0)
    assert frozen.temperature == pytest.approx(0.05)


# ------------------------------------------------------------------------------------------------ recipe
def test_care_init_schema_old_form_new_form_and_clear_errors():
    from medadapt.care.sections import CareRecipe
    from medadapt.errors import ConfigError
    from medadapt.recipes import load_recipe

    old = load_recipe(RECIPES / "care-tiny.yaml", expect=CareRecipe)  # the flat form = supervised step only
    assert old.init.query.pretrain is None and old.init.query.unsupervised is None and old.init.query.supervised
    new = load_recipe(RECIPES / "care-tiny-init.yaml", expect=CareRecipe)
    assert new.name == "care-tiny-init"
    assert (new.init.query.pretrain.encoder_mask_ratio, new.init.query.pretrain.decoder_mask_ratio) == (0.3, 0.5)
    assert new.init.query.unsupervised.positives == "title_text" and new.init.query.supervised

    paper = load_recipe(RECIPES / "care.yaml", expect=CareRecipe)  # Appendix C.1.1 / Table 17
    q = paper.init.query
    assert (q.pretrain.lr, q.pretrain.warmup_ratio, q.pretrain.epochs) == (2e-4, 0.0, 3)
    assert q.pretrain.effective_batch_size == 384
    assert (q.unsupervised.lr, q.unsupervised.epochs, q.unsupervised.effective_batch_size) == (1e-4, 3, 19_200)
    assert (q.lr, q.epochs, q.effective_batch_size) == (1e-4, 2, 640)

    f = RECIPES / "care-tiny-init.yaml"
    with pytest.raises(ConfigError, match=r"init\.query\.pretrain\.encoder_mask_ratio"):
        load_recipe(f, ["init.query.pretrain.encoder_mask_ratio=1.5"])
    with pytest.raises(ConfigError, match="decoder_mask_ratio .* must be >= encoder_mask_ratio"):
        load_recipe(f, ["init.query.pretrain.decoder_mask_ratio=0.1"])
    with pytest.raises(ConfigError, match=r"init\.query\.unsupervised\.positives"):
        load_recipe(f, ["init.query.unsupervised.positives=crops"])
    with pytest.raises(ConfigError, match="min_temperature .* must not exceed"):
        load_recipe(f, ["init.query.unsupervised.min_temperature=0.1"])
    with pytest.raises(ConfigError, match="no step left"):
        load_recipe(f, ["init.query.supervised=false", "init.query.pretrain=null", "init.query.unsupervised=null"])
    with pytest.raises(ConfigError, match="needs a query tower of kind sentence_transformer"):
        load_recipe(f, ["query={kind: static}"])


def test_plan_lists_the_query_init_steps():
    from medadapt.care.plan import plan_spec
    from medadapt.care.sections import CareRecipe
    from medadapt.recipes import load_recipe

    spec = plan_spec(load_recipe(RECIPES / "care.yaml", expect=CareRecipe))
    phases = {p.name: p for p in spec.phases}
    assert list(phases)[:4] == ["init query: RetroMAE", "init query: unsupervised", "init query", "init document"]
    assert phases["init query: RetroMAE"].global_batch == 384
    assert phases["init query: unsupervised"].global_batch == 19_200
    assert phases["init query: unsupervised"].uses[0].texts == 2  # two views / title + content
    assert phases["init query"].global_batch == 640
    flat = plan_spec(load_recipe(RECIPES / "care-tiny.yaml", expect=CareRecipe))
    assert [p.name for p in flat.phases][:1] == ["init query"]


def _overrides(qwen, bert, beir) -> list[str]:
    return [f"document.model={qwen}", f"query.model={bert}", f"data.path={beir}"]


def test_tiny_recipe_runs_the_three_query_init_steps_end_to_end_and_resumes(tiny_bert_dir, tiny_qwen2_dir,
                                                                            tiny_beir_dir, tmp_path):
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer

    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import run_recipe

    qwen = tiny_qwen2_dir
    out = tmp_path / "run"
    overrides = _overrides(qwen, tiny_bert_dir, tiny_beir_dir)
    cache = EmbeddingCache(tmp_path / "cache")
    result = run_recipe(RECIPES / "care-tiny-init.yaml", out, overrides, cache=cache, **QUIET)
    stages = result.details["stages"]
    # 24 texts (12 train queries + 12 documents): RetroMAE 4 x 2 accumulation -> 3 steps x 2 epochs; the
    # unsupervised step 3 steps (12 title-content pairs + 12 query self-pairs); supervised 12 pairs / 8 -> 2
    assert {k: v["steps"] for k, v in stages.items()} == {
        "init_document": 2, "init_query_pretrain": 6, "init_query_unsupervised": 3, "init_query": 2,
        "stage1": 6, "stage2": 3}
    order = [r["stage"] for r in result.loss_history]
    assert order == ["init_document"] * 2 + ["init_query_pretrain"] * 6 + ["init_query_unsupervised"] * 3 + \
        ["init_query"] * 2 + ["stage1"] * 6 + ["stage2"] * 3
    temperature = stages["init_query_unsupervised"]["temperature"]
    assert temperature > 0 and temperature != pytest.approx(0.05, abs=1e-4)
    assert sorted(p.name for p in (tmp_path / "run.checkpoints").iterdir()) == [
        "init_document", "init_query", "init_query_pretrain", "init_query_unsupervised", "stage1", "stage2"]
    # the RetroMAE decoder and the temperature are not part of the saved model
    keys = {k for f in out.rglob("*.safetensors") for k in load_file(str(f))}
    assert keys and not any("decoder_positions" in k or "log_temperature" in k or "head.predictions" in k
                            for k in keys)
    model = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    assert model.encode_query(["gout"]).shape == model.encode_document(["gout"]).shape == (1, 32)

    # the pre-training steps changed the query tower: the same recipe without them ends elsewhere
    plain = run_recipe(RECIPES / "care-tiny-init.yaml", tmp_path / "plain",
                       overrides + ["init.query.pretrain=null", "init.query.unsupervised=null"],
                       cache=cache, evaluate=False, **QUIET)
    assert set(plain.details["stages"]) == {"init_document", "init_query", "stage1", "stage2"}
    q = ["symptoms of gout"]
    assert not torch.allclose(torch.tensor(model.encode_query(q)), torch.tensor(plain.model.encode_query(q)),
                              atol=1e-4)

    # a re-run resumes every phase from its final checkpoint and reproduces the model exactly
    again = run_recipe(RECIPES / "care-tiny-init.yaml", out, overrides, cache=cache, **QUIET)
    assert again.loss_history == result.loss_history and again.metrics == result.metrics
    assert again.details["stages"]["init_query_unsupervised"]["temperature"] == temperature


def test_document_init_honours_gradient_checkpointing_without_lora(tiny_bert_dir, tiny_qwen2_dir, tiny_beir_dir,
                                                                   tmp_path, monkeypatch):
    import medadapt.training.lora as lora_mod
    from medadapt.recipes import run_recipe

    calls = []
    real = lora_mod.enable_gradient_checkpointing

    def spy(model):
        calls.append(model)
        return real(model)

    monkeypatch.setattr(lora_mod, "enable_gradient_checkpointing", spy)
    qwen = tiny_qwen2_dir
    base = _overrides(qwen, tiny_bert_dir, tiny_beir_dir) + [
        "init.query=null", "stage1.enabled=false", "stage2.enabled=false", "document.lora=null"]
    kw = {"evaluate": False, **QUIET}
    run_recipe(RECIPES / "care-tiny-init.yaml", tmp_path / "off", base, **kw)
    assert calls == []
    result = run_recipe(RECIPES / "care-tiny-init.yaml", tmp_path / "on", base + ["document.gradient_checkpointing=true"],
                        **kw)
    assert len(calls) == 1 and result.details["stages"]["init_document"]["steps"] == 2
    assert calls[0][0].model.is_gradient_checkpointing
