"""HyReC on the one training loop (medadapt.hyrec.train): the Python API and the YAML recipe are one config,
gradient accumulation equals the large batch, a resumed run equals an uninterrupted one, partial batches,
two parameter groups, frozen parts without dropout, mixed precision."""

from __future__ import annotations

import pytest
import torch

from medadapt.hyrec.data import Example
from medadapt.hyrec.model import HyReCConfig, HyReCModel
from medadapt.hyrec.sections import (
    HyReCDataSection,
    HyReCLossSection,
    HyReCModelSection,
    HyReCRecipe,
    HyReCTrainingSection,
)
from medadapt.hyrec.train import train_hyrec
from medadapt.recipes import load_recipe
from medadapt.training.checkpoint import CheckpointConfig

pytestmark = pytest.mark.usefixtures("_single_thread")

EXAMPLES = [
    Example("gout pain in the toe", "gout is a condition with toe uric acid crystals", ["asthma and wheezing", "sleep"]),
    Example("asthma inhaler", "asthma is a condition with wheezing inhaler airway", ["gout toe", "itchy skin"]),
    Example("migraine headache from light", "migraine aura light nausea", ["eczema skin rash"]),
    Example("eczema", "eczema itchy skin rash dry cream dermatitis", ["gout toe", "insomnia at night"]),
    Example("influenza fever", "influenza fever flu vaccine aches virus", ["anemia iron", "pale"]),
]


def _model(bert, dropout: bool = True, **config) -> HyReCModel:
    torch.manual_seed(0)
    model = HyReCModel.from_backbone(str(bert), HyReCConfig(language="en", **config))
    if not dropout:
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    return model


def test_python_api_equals_the_minimal_yaml(tmp_path):
    """The pydantic sections are the config: a recipe built in Python with the minimal fields is the
    recipe the minimal YAML validates into, defaults included (HyReC's, not the generic optimiser's)."""
    built = HyReCRecipe(name="mini", data=HyReCDataSection(path="medmini"),
                        model=HyReCModelSection(backbone="minilm"))
    path = tmp_path / "mini.yaml"
    path.write_text("kind: hyrec\nname: mini\ndata: {path: medmini}\nmodel: {backbone: minilm}\n")
    loaded = load_recipe(path)
    assert isinstance(loaded, HyReCRecipe)
    assert loaded.model_dump() == built.model_dump()
    tr = loaded.training
    assert tr == HyReCTrainingSection()
    assert (tr.lr, tr.warmup_ratio, tr.batch_size, tr.epochs, tr.scheduler, tr.lexical_words) == (
        5e-5, 0.05, 32, 1, "linear", "predicted")
    assert (tr.seed, tr.mixed_precision, tr.checkpoint_every_steps) == (42, "no", None)  # the run settings


@pytest.mark.parametrize("words", ["predicted", "labels"])
def test_accumulation_equals_the_large_batch(tiny_bert_dir, words):
    """GradCache accumulation over chunks (each padded to the step's token length) trains as one batch:
    the loss curve of 4 x 1 equals that of 1 x 4 (dropout off: chunks would draw other masks)."""
    runs = {}
    for batch, acc in ((4, 1), (2, 2), (1, 4)):
        model = _model(tiny_bert_dir, dropout=False)
        res = train_hyrec(model, EXAMPLES, HyReCTrainingSection(batch_size=batch, gradient_accumulation_steps=acc,
                                                                epochs=3, lr=1e-3, lexical_words=words),
                          HyReCLossSection())
        runs[(batch, acc)] = (res.loss_history, list(model.parameters()))
    ref_rows, ref_params = runs[(4, 1)]
    assert len(ref_rows) == 6  # 5 examples at 4 per step: a full and a partial step per epoch
    for key, (rows, params) in runs.items():
        for a, b in zip(rows, ref_rows):
            for part in ("loss", "lexical", "dense", "union"):
                assert a[part] == pytest.approx(b[part], abs=1e-5), (key, part)
        for p, q in zip(params, ref_params):
            torch.testing.assert_close(p, q, atol=2e-4, rtol=1e-3)


def test_resume_equals_uninterrupted(tiny_bert_dir, tmp_path):
    """A run killed after step 3 (checkpoint every 2 steps) and started again ends with exactly the weights
    and loss history of an uninterrupted run, dropout included (the loop re-seeds every step)."""
    training = HyReCTrainingSection(batch_size=2, epochs=3, lr=1e-3, warmup_ratio=0.2)
    whole = _model(tiny_bert_dir)
    ref = train_hyrec(whole, EXAMPLES, training, HyReCLossSection())

    class Kill(Exception):
        pass

    def kill(stage, step, total, row):
        if step == 3:
            raise Kill

    ckpt = CheckpointConfig(tmp_path / "ck", every_steps=2)
    with pytest.raises(Kill):
        train_hyrec(_model(tiny_bert_dir), EXAMPLES, training, HyReCLossSection(), checkpoint=ckpt,
                    fingerprint="a", progress=kill)
    assert sorted(p.name for p in ckpt.directory.glob("step-*")) == ["step-00000002"]
    resumed = _model(tiny_bert_dir)
    res = train_hyrec(resumed, EXAMPLES, training, HyReCLossSection(), checkpoint=ckpt, fingerprint="a")
    assert [r["loss"] for r in res.loss_history] == [r["loss"] for r in ref.loss_history]
    assert len(ref.loss_history) == 9
    for (name, a), b in zip(whole.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), name


def test_a_one_item_batch_has_no_in_batch_negative(tiny_bert_dir):
    """The loop keeps the partial last batch: with one item and no hard negative the contrastive parts are
    exactly 0 (one candidate), the union part is not; with a hard negative the contrastive parts are > 0."""
    no_neg = [Example(e.query, e.positive, []) for e in EXAMPLES[:3]]
    res = train_hyrec(_model(tiny_bert_dir), no_neg, HyReCTrainingSection(batch_size=2, lr=1e-3), HyReCLossSection())
    full, last = res.loss_history
    assert last["lexical"] == 0.0 and last["dense"] == 0.0 and last["union"] > 0.1
    assert full["lexical"] > 0 and full["dense"] > 0  # two items: one in-batch negative each
    res = train_hyrec(_model(tiny_bert_dir), EXAMPLES[:3], HyReCTrainingSection(batch_size=2, lr=1e-3),
                      HyReCLossSection())
    assert res.loss_history[-1]["lexical"] > 0 and res.loss_history[-1]["dense"] > 0


def test_encoder_and_projectors_are_two_parameter_groups(tiny_bert_dir):
    """``lr`` drives the encoders, ``head_lr`` the projectors."""
    model = _model(tiny_bert_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_hyrec(model, EXAMPLES, HyReCTrainingSection(batch_size=5, epochs=2, lr=1e-9, head_lr=1e-2,
                                                      warmup_ratio=0.0), HyReCLossSection())
    moved = {n: float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters()}
    assert max(v for n, v in moved.items() if n.startswith(("st.4.lexicon.", "st.0."))) < 1e-7
    assert min(moved["st.4.weight_proj.linear.weight"], moved["st.4.union_proj.linear.weight"],
               moved["st.2.linear.weight"]) > 1e-3


def test_frozen_parts_run_without_dropout(tiny_bert_dir):
    """Frozen variant, frozen dense encoder: the sharing backbone and the dense layers run in eval mode while
    the lexicon encoder trains in train mode; the frozen weights do not move."""
    model = _model(tiny_bert_dir, variant="frozen")
    seen: dict[str, set[bool]] = {"shared": set(), "dense": set(), "lexicon": set()}
    for name, module in (("shared", model.shared_layers[0]), ("dense", model.dense_layers[0]),
                         ("lexicon", model.lexicon[0])):
        module.register_forward_hook(lambda m, i, o, name=name: seen[name].add(m.training))
    frozen = [p.detach().clone() for layer in model.dense_layers for p in layer.parameters()]
    train_hyrec(model, EXAMPLES, HyReCTrainingSection(batch_size=3, lr=1e-3, train_dense_encoder=False),
                HyReCLossSection())
    assert seen == {"shared": {False}, "dense": {False}, "lexicon": {True}}
    after = [p for layer in model.dense_layers for p in layer.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(frozen, after))
    assert not model.training  # left in eval mode


def test_bf16_runs_the_forward_pass_in_bf16(tiny_bert_dir):
    """Mixed precision goes through the accelerator's autocast: the projectors see bf16 activations."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    model = _model(tiny_bert_dir)
    dtypes = set()
    model.weight_proj.register_forward_hook(lambda m, i, o: dtypes.add(o.dtype))
    AcceleratorState._reset_state(True)  # an earlier test's Accelerator fixed the process-wide precision
    try:
        res = train_hyrec(model, EXAMPLES, HyReCTrainingSection(batch_size=5, lr=1e-3),
                          HyReCLossSection(), accelerator=Accelerator(cpu=True, mixed_precision="bf16"))
    finally:
        AcceleratorState._reset_state(True)
    assert dtypes == {torch.bfloat16}
    assert model.weight_proj.linear.weight.dtype == torch.float32  # master weights stay fp32
    assert res.loss_history[0]["loss"] > 0


def test_cached_dense_inputs_serve_training_rows_from_memory(tiny_bert, tmp_path, monkeypatch):
    """A training step looks its pooled dense inputs up in memory; only texts outside the declared ones go to
    the embedding cache (which fingerprints the backbone and lists its shards on every call)."""
    import numpy as np

    from medadapt.cache import EmbeddingCache, backbone_view
    from medadapt.hyrec.data import CachedDenseInputs

    cache, view = EmbeddingCache(tmp_path), backbone_view(tiny_bert)
    dense = CachedDenseInputs(cache, view, ["gout toe", "asthma"], ["gout is arthritis", "inhalers help"]).fill()
    real, calls = cache.encode, []
    monkeypatch.setattr(cache, "encode", lambda *a, **k: calls.append(a) or real(*a, **k))
    got = dense(["asthma", "gout toe", "asthma"], "query")
    assert not calls
    np.testing.assert_array_equal(got.numpy(), real(view, ["asthma", "gout toe", "asthma"], role="query",
                                                    show_progress=False))
    np.testing.assert_array_equal(dense(["unseen text"], "document").numpy(),
                                  real(view, ["unseen text"], role="document", show_progress=False))
    assert len(calls) == 1
