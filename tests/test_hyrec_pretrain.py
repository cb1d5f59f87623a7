"""HyReC's RetroMAE pre-training stage (issue 16 item 1): the ``pretrain`` section runs the neutral RetroMAE
objective (:mod:`medadapt.training.retromae`) on the tiny twin's corpus + train queries as the first stage of
the one training loop; its loss goes down on a repeated tiny corpus, the next stages start from its weights
(with the lexicon encoder re-copied from the pre-trained dense layers), a run killed inside it resumes onto the
uninterrupted run, the frozen variant pre-trains the dense encoder only, bad input is one clear error, and
the paper recipe carries (and plans) the paper's values."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from medadapt.errors import ConfigError, DataError
from medadapt.hyrec.sections import HyReCRecipe, HyReCTrainingSection, PretrainSection
from medadapt.recipes import load_recipe, run_recipe

pytestmark = pytest.mark.usefixtures("_single_thread")

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "hyrec-tiny.yaml"
QUIET = {"show_progress": False, "log": lambda m: None}


def _overrides(bert, beir, *extra) -> list[str]:
    return [f"model.backbone={bert}", f"data.path={beir}", "training.epochs=1", "pretrain.epochs=2",
            "pretrain.batch_size=8", "pretrain.lr=3e-3", "pretrain.warmup_ratio=0.0", *extra]


def _recipe(bert, beir, *extra) -> HyReCRecipe:
    return load_recipe(TINY, _overrides(bert, beir, *extra), expect=HyReCRecipe)


def _n_texts(beir) -> int:
    """Distinct corpus documents (title + text) and train queries of the fixture folder, counted from its files."""
    docs = [json.loads(ln) for ln in (beir / "corpus.jsonl").read_text().splitlines()]
    queries = {json.loads(ln)["_id"]: json.loads(ln)["text"] for ln in (beir / "queries.jsonl").read_text().splitlines()}
    train = {ln.split("\t")[0] for ln in (beir / "qrels" / "train.tsv").read_text().splitlines()[1:]}
    return len({f"{d['title']} {d['text']}" for d in docs} | {queries[q] for q in train})


class _Snapshots:
    """Wraps :func:`medadapt.hyrec.train.pretrain_stage` and :func:`~medadapt.hyrec.train.hyrec_stage` so
    every stage records the HyReC model's weights when it starts and when it has ended (after its own
    ``on_end``, i.e. after the lexicon re-copy of the pre-training)."""

    def __init__(self, monkeypatch):
        import medadapt.hyrec.train as ht

        self.at: dict[str, dict[str, torch.Tensor]] = {}
        real_pre, real_stage = ht.pretrain_stage, ht.hyrec_stage

        def hook(model, stage):
            start, end = stage.on_start, stage.on_end

            def snap(when):
                self.at[f"{stage.name}:{when}"] = {n: p.detach().clone() for n, p in model.named_parameters()}

            def on_start():
                snap("start")
                if start is not None:
                    start()

            def on_end():
                if end is not None:
                    end()
                snap("end")

            stage.on_start, stage.on_end = on_start, on_end
            return stage

        def pre(model, *a, **k):
            module, stage = real_pre(model, *a, **k)
            return module, hook(model, stage)

        monkeypatch.setattr(ht, "pretrain_stage", pre)
        monkeypatch.setattr(ht, "hyrec_stage", lambda model, *a, **k: hook(model, real_stage(model, *a, **k)))


def _same(a: dict, b: dict, names) -> bool:
    return all(torch.equal(a[n], b[n]) for n in names)


def test_pretrain_loss_goes_down_on_a_repeated_tiny_corpus(tiny_bert_dir, tiny_beir_dir, tmp_path):
    n_texts = _n_texts(tiny_beir_dir)
    assert n_texts == 24  # 12 documents + 12 train queries, none repeated
    recipe = _recipe(tiny_bert_dir, tiny_beir_dir, "pretrain.epochs=30")
    res = run_recipe(recipe, tmp_path / "run", evaluate=False, **QUIET)
    d = res.details["pretrain"]
    per_epoch = -(-n_texts // 8)
    assert (d["texts"], d["steps"]) == (n_texts, 30 * per_epoch)
    rows = [r for r in res.loss_history if r["stage"] == "pretrain"]
    assert [r["stage"] for r in res.loss_history] == ["pretrain"] * d["steps"] + ["hyrec"] * 2  # first, then main
    assert (d["first_loss"], d["last_loss"]) == (rows[0]["loss"], rows[-1]["loss"])
    for r in rows:  # the loss is the encoder's + the decoder's mean masked-token cross-entropy
        assert r["loss"] == pytest.approx(r["mlm_encoder"] + r["mlm_decoder"], rel=1e-6)
    first = np.mean([r["loss"] for r in rows[: 2 * per_epoch]])
    last = np.mean([r["loss"] for r in rows[-2 * per_epoch:]])
    assert last < 0.75 * first, (first, last)  # measured 9.9 -> 5.7 (first / last two epochs)
    from conftest import tiny_vocab

    assert first == pytest.approx(2 * np.log(len(tiny_vocab())), rel=0.1)  # untrained: ~ln(vocabulary) per part
    assert res.details["steps"] == d["steps"] + 2


def test_pretrained_weights_are_where_the_next_stages_start(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    """pretrain -> prefinetune -> main: the pre-training changes the backbone, the lexicon encoder is then a
    copy of the pre-trained dense layer (the paper's init), the preliminary stage starts from exactly those
    weights, and nothing of RetroMAE's decoder / MLM head reaches the saved model."""
    from medadapt.hyrec.model import HyReCModel

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": f"q {i}", "pos": [f"diabetes {i} insulin"]}) + "\n"
                             for i in range(6)))
    snaps = _Snapshots(monkeypatch)
    recipe = _recipe(tiny_bert_dir, tiny_beir_dir, f"prefinetune.data={pairs}", "prefinetune.scorer=null",
                     "prefinetune.batch_size=3", "prefinetune.epochs=1")
    res = run_recipe(recipe, tmp_path / "run", evaluate=False, **QUIET)
    at = dict(snaps.at)
    assert set(at) == {f"{s}:{w}" for s in ("pretrain", "prefinetune", "hyrec") for w in ("start", "end")}
    assert [r["stage"] for r in res.loss_history] == ["pretrain"] * 6 + ["prefinetune"] * 2 + ["hyrec"] * 2

    names = list(at["pretrain:start"])
    backbone = [n for n in names if n.startswith("st.0.") and ".pooler." not in n]
    lexicon = [n for n in names if ".lexicon." in n]  # the lexical branch: the model's last module
    heads = [n for n in names if not n.startswith("st.0.") and ".lexicon." not in n]
    assert backbone and lexicon and heads
    start, end = at["pretrain:start"], at["pretrain:end"]
    changed = [n for n in backbone if not torch.equal(start[n], end[n])]
    assert set(changed) == set(backbone)  # every embedding and layer tensor was pre-trained (pooler: unused)
    assert _same(start, end, heads)  # the projectors do not take part
    n_layers = sum(1 for n in backbone if n.endswith("attention.self.query.weight"))
    dense = next(n for n in backbone if n.endswith(f"layer.{n_layers - 1}.attention.self.query.weight"))
    dense = dense.removesuffix("attention.self.query.weight")  # the dense encoder: the backbone's last layer
    for n in lexicon:  # re-copied from the pre-trained dense layer
        torch.testing.assert_close(end[n], end[dense + n.split(".lexicon.")[1].split(".", 1)[1]], rtol=0, atol=0)
        assert not torch.equal(end[n], start[n]), n
    assert _same(at["prefinetune:start"], end, names)  # the next stage starts from the pre-trained weights
    assert _same(at["hyrec:start"], at["prefinetune:end"], names)
    saved = HyReCModel.load(tmp_path / "run")
    assert [n for n, _ in saved.named_parameters()] == names  # no decoder, no MLM head
    for n, p in saved.named_parameters():
        torch.testing.assert_close(p, at["hyrec:end"][n])

    # the same recipe without the stage starts its first stage from the initial weights
    snaps.at.clear()
    plain = load_recipe(TINY, [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "training.epochs=1"],
                        expect=HyReCRecipe)
    run_recipe(plain, tmp_path / "plain", evaluate=False, **QUIET)
    assert set(snaps.at) == {"hyrec:start", "hyrec:end"}
    assert _same(snaps.at["hyrec:start"], start, names)


def test_a_run_killed_inside_pretrain_resumes_to_the_uninterrupted_run(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                       monkeypatch):
    """Checkpoints every 2 steps; killed after pretrain step 5, the run resumes from step 4 (RetroMAE's decoder
    and head come back from the checkpoint too) and repeats the uninterrupted losses and weights exactly."""
    import medadapt.recipes.run as rr
    from medadapt.hyrec.model import HyReCModel
    from medadapt.recipes.run import checkpoint_dir_for
    from medadapt.training.checkpoint import load_checkpoint

    recipe = _recipe(tiny_bert_dir, tiny_beir_dir, "training.checkpoint_every_steps=2")
    ref = run_recipe(recipe, tmp_path / "whole", evaluate=False, **QUIET)
    assert ref.details["pretrain"]["steps"] == 6

    class Kill(Exception):
        pass

    class KillBar:
        def __call__(self, stage, step, total, row):
            if stage == "pretrain" and step == 5:
                raise Kill

        def close(self):
            pass

    monkeypatch.setattr(rr.RunContext, "progress", lambda self: KillBar())
    out = tmp_path / "killed"
    with pytest.raises(Kill):
        run_recipe(recipe, out, evaluate=False, **QUIET)
    assert not out.exists()
    ckpts = sorted(checkpoint_dir_for(out).glob("step-*"))
    assert [p.name for p in ckpts] == ["step-00000002", "step-00000004"]
    tensors = load_checkpoint(ckpts[-1])[0]
    assert any(k.startswith("retromae.decoder.") for k in tensors)  # the decoder is resumed, not redrawn
    assert any(k.startswith("retromae.head.") for k in tensors)

    monkeypatch.setattr(rr.RunContext, "progress", lambda self: None)
    res = run_recipe(recipe, out, evaluate=False, **QUIET)
    assert [r["loss"] for r in res.loss_history] == [r["loss"] for r in ref.loss_history]
    assert res.details["pretrain"] == ref.details["pretrain"]
    a, b = HyReCModel.load(tmp_path / "whole"), HyReCModel.load(out)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name


def test_frozen_variant_pretrains_the_dense_encoder_only(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    snaps = _Snapshots(monkeypatch)
    recipe = _recipe(tiny_bert_dir, tiny_beir_dir, "model.variant=frozen")
    run_recipe(recipe, tmp_path / "run", evaluate=False, **QUIET)
    start, end = snaps.at["pretrain:start"], snaps.at["pretrain:end"]
    backbone = [n for n in start if n.startswith("st.0.")]
    fixed = [n for n in backbone if ".embeddings." in n or ".encoder.layer.0." in n]  # sharing backbone
    trained = [n for n in backbone if ".encoder.layer.1." in n]  # dense encoder
    assert fixed and trained
    assert _same(start, end, fixed)
    assert not any(torch.equal(start[n], end[n]) for n in trained)


def test_pretrain_texts_from_a_jsonl_file(tiny_bert_dir, tiny_beir_dir, tmp_path):
    texts = tmp_path / "texts.jsonl"
    lines = ["insulin lowers blood sugar", "an inhaler opens the airway", "insulin lowers blood sugar", "  ",
             "gout attacks the big toe"]
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    res = run_recipe(_recipe(tiny_bert_dir, tiny_beir_dir, f"pretrain.data={texts}", "pretrain.batch_size=2"),
                     tmp_path / "run", evaluate=False, **QUIET)
    assert res.details["pretrain"]["texts"] == 3  # distinct, blank dropped
    assert res.details["pretrain"]["steps"] == 2 * 2
    res = run_recipe(_recipe(tiny_bert_dir, tiny_beir_dir, "pretrain.include_corpus=false", "pretrain.max_texts=5"),
                     tmp_path / "queries", evaluate=False, **QUIET)
    assert res.details["pretrain"]["texts"] == 5  # 12 train queries, capped


def test_bad_pretrain_input_is_one_clear_error(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from medadapt.cli import app
    from medadapt.hyrec.model import HyReCConfig, HyReCModel
    from medadapt.hyrec.train import pretrain_stage

    for field in ("encoder_mask_ratio", "decoder_mask_ratio"):
        for bad in ("0", "1", "1.5", "-0.1"):
            with pytest.raises(ConfigError, match=field):
                load_recipe(TINY, [f"pretrain.{field}={bad}"])
    with pytest.raises(ConfigError, match="decoder_mask_ratio .* must be >= encoder_mask_ratio"):
        load_recipe(TINY, ["pretrain.encoder_mask_ratio=0.6", "pretrain.decoder_mask_ratio=0.5"])
    with pytest.raises(ConfigError, match="pretrain: nothing to train"):
        load_recipe(TINY, ["pretrain.epochs=1", "model.variant=frozen", "training.train_dense_encoder=false"])
    with pytest.raises(ConfigError, match="bogus"):
        load_recipe(TINY, ["pretrain.bogus=1"])
    # the Python API says the same
    model = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCConfig(language="en", variant="frozen"))
    with pytest.raises(ConfigError, match="nothing to train"):
        pretrain_stage(model, ["a text"], PretrainSection(), HyReCTrainingSection(train_dense_encoder=False))
    with pytest.raises(ConfigError, match="no texts"):
        pretrain_stage(model, [], PretrainSection())
    # missing texts: one error line from the CLI, nothing written
    missing = tmp_path / "missing.jsonl"
    over = _overrides(tiny_bert_dir, tiny_beir_dir, f"pretrain.data={missing}")
    with pytest.raises(DataError, match="pre-training texts not found"):
        run_recipe(load_recipe(TINY, over), tmp_path / "run", **QUIET)
    assert not (tmp_path / "run").exists()
    res = CliRunner().invoke(app, ["train", str(TINY), "--output", str(tmp_path / "cli"), "--quiet",
                                   *[a for o in over for a in ("--set", o)]])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "pre-training texts not found" in errors[0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": 3}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: field 'text' must be str"):
        run_recipe(_recipe(tiny_bert_dir, tiny_beir_dir, f"pretrain.data={bad}"), tmp_path / "run2", **QUIET)
    with pytest.raises(ConfigError, match="query_splits needs a BEIR folder"):
        run_recipe(_recipe(tiny_bert_dir, tiny_beir_dir, f"pretrain.data={bad}", "pretrain.query_splits=[train]"),
                   tmp_path / "run3", **QUIET)


def test_paper_recipe_declares_and_plans_the_pretraining():
    """hyrec.yaml: the paper's pre-training values (§4.1.3) and RetroMAE's defaults where the paper is silent;
    `medadapt plan` puts the pre-training phase first: 512 texts x 512 tokens per step."""
    from medadapt.plan import Hardware, plan_recipe

    r = load_recipe(ROOT / "recipes" / "hyrec.yaml", expect=HyReCRecipe)
    pt = r.pretrain
    assert pt is not None
    assert (pt.batch_size, pt.max_length, pt.lr, pt.warmup_ratio, pt.weight_decay) == (512, 512, 1e-4, 0.1, 0.01)
    assert (pt.encoder_mask_ratio, pt.decoder_mask_ratio, pt.epochs, pt.scheduler) == (0.3, 0.5, 8, "linear")
    plan = plan_recipe(r, Hardware(num_gpus=1, gpu_memory_gb=80))
    assert [p.name for p in plan.phases] == ["RetroMAE pre-training", "preliminary fine-tuning", "fine-tuning"]
    assert plan.phases[0].tokens_per_step == 512 * 512
    assert any("RetroMAE" in n and "logits on the masked tokens are counted" in n for n in plan.notes)
    # the MLM head's logits: (0.3 + 0.5) x 512 masked tokens x bge-base-zh's 21,128-word vocabulary x 10 bytes,
    # on top of the encoder's activations (on an H100 the plan had missed them: 3.3 GiB planned, 8.8 measured)
    import dataclasses

    from medadapt.plan import describe_recipe

    spec = describe_recipe(r)
    assert spec.phases[0].extra_bytes_per_example == pytest.approx(0.8 * 512 * 21128 * 10)
    bare = dataclasses.replace(spec, phases=(dataclasses.replace(spec.phases[0], extra_bytes_per_example=0.0),
                                             *spec.phases[1:]))
    without = plan_recipe(r, Hardware(num_gpus=1, gpu_memory_gb=80), spec=bare).phases[0]
    assert plan.phases[0].activations_per_example_no_ckpt_gb - without.activations_per_example_no_ckpt_gb == \
        pytest.approx(0.8 * 512 * 21128 * 10 / 2**30)
    res = CliRunner().invoke(__import__("medadapt.cli", fromlist=["app"]).app, ["plan", str(ROOT / "recipes/hyrec.yaml")])
    assert res.exit_code == 0 and "RetroMAE pre-training" in res.output, res.output
    # section defaults are the paper's too (a recipe that writes only `pretrain: {data: ...}`)
    d = PretrainSection()
    assert (d.lr, d.warmup_ratio, d.weight_decay, d.encoder_mask_ratio, d.decoder_mask_ratio) == (1e-4, 0.1, 0.01,
                                                                                                 0.3, 0.5)


def test_retromae_from_scratch(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    """model.init: scratch keeps the backbone's architecture and tokenizer and draws its weights anew (the
    same draw for the same seed, none of the checkpoint's values), then RetroMAE pre-trains them; without a
    pretrain section it is one clear error."""
    from medadapt.hyrec.model import HyReCConfig, HyReCModel

    with pytest.raises(ConfigError, match="model.init: scratch .* add a pretrain section"):
        load_recipe(TINY, [f"model.backbone={tiny_bert_dir}", "model.init=scratch"], expect=HyReCRecipe)
    cfg = HyReCConfig(language="en")
    pretrained = dict(HyReCModel.from_backbone(str(tiny_bert_dir), cfg).named_parameters())
    a = dict(HyReCModel.from_backbone(str(tiny_bert_dir), cfg, scratch=True, seed=3).named_parameters())
    b = dict(HyReCModel.from_backbone(str(tiny_bert_dir), cfg, scratch=True, seed=3).named_parameters())
    matrices = [n for n in a if n.startswith("st.0.") and a[n].ndim == 2]
    assert matrices and all(torch.equal(a[n], b[n]) for n in a if n.startswith("st.0."))  # the backbone
    assert not any(torch.equal(a[n], pretrained[n]) for n in matrices)
    lexicon = [n for n in a if ".lexicon." in n]
    assert lexicon and not any(torch.equal(a[n], pretrained[n]) for n in lexicon if a[n].ndim == 2)

    snaps = _Snapshots(monkeypatch)
    res = run_recipe(_recipe(tiny_bert_dir, tiny_beir_dir, "model.init=scratch"), tmp_path / "run", evaluate=False,
                     **QUIET)
    start, end = snaps.at["pretrain:start"], snaps.at["pretrain:end"]
    seeded = dict(HyReCModel.from_backbone(str(tiny_bert_dir), cfg, scratch=True, seed=42).named_parameters())
    assert all(torch.equal(start[n], seeded[n]) for n in matrices)  # training.seed 42 draws the start
    assert all(not torch.equal(start[n], end[n]) for n in matrices if ".pooler." not in n)
    assert res.details["pretrain"]["steps"] == 6
