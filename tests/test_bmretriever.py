"""BMRetriever (issue #8): instructions, stage I / II data builders, synthetic data, the decoder retriever,
recipes (every shipped one validates, the tiny twin trains end to end and resumes).

Models are tiny and random, built offline: the Qwen2 decoder comes from ``medadapt.tiny.build_tiny_qwen2``, the
BERT base retriever from ``conftest``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from conftest import TOPICS
from medadapt.tiny import build_tiny_qwen2

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_decoder_dir(tmp_path_factory) -> Path:
    return build_tiny_qwen2(tmp_path_factory.mktemp("bmr_qwen2"), padding_side="right")


# ------------------------------------------------------------------------------------------- instructions
def test_instruction_tables_and_query_prompt():
    from medadapt.bmretriever import EVAL_INSTRUCTIONS, FINETUNE_INSTRUCTIONS, query_prompt

    assert len(FINETUNE_INSTRUCTIONS) == 12 and len(EVAL_INSTRUCTIONS) == 11
    assert EVAL_INSTRUCTIONS["drugbank"] == "Given a drug, retrieve passages for its definition"
    assert query_prompt("Find it") == "Find it\nQuery: "
    assert query_prompt("") == ""
    with pytest.raises(ValueError, match="placeholder"):
        query_prompt("x", "no placeholder")


# ------------------------------------------------------------------------------------------- stage I data
def test_crop_pair_gives_two_disjoint_spans_deterministically():
    from medadapt.bmretriever import CropConfig, crop_pair

    words = [f"w{i}" for i in range(100)]
    text = " ".join(words)
    cfg = CropConfig(min_words=5, max_words=20)
    for seed in range(30):
        a, b = crop_pair(text, random.Random(seed), cfg)
        sa, sb = a.split(), b.split()
        assert 5 <= len(sa) <= 20 and 5 <= len(sb) <= 20
        assert not set(sa) & set(sb)  # disjoint
        assert a in text and b in text  # contiguous spans
        assert crop_pair(text, random.Random(seed), cfg) == (a, b)
    assert crop_pair("too short", random.Random(0), cfg) is None
    with pytest.raises(ValueError):
        CropConfig(min_words=5, max_words=2)


def _write_corpus(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_pretrain_pairs_title_and_crop_modes(tmp_path):
    from medadapt.bmretriever import CorpusSource, CropConfig, iter_pretrain_pairs, pretrain_dataset
    from medadapt.errors import DataError

    long = " ".join(f"token{i}" for i in range(40))
    f = _write_corpus(tmp_path / "c.jsonl", [
        {"_id": "a", "title": "Asthma", "text": "wheezing and cough"},
        {"_id": "b", "title": "", "text": long},
        {"_id": "c", "text": "short"},
    ])
    crop = CropConfig(4, 8)
    auto = list(iter_pretrain_pairs([CorpusSource(f)], crop, seed=1))
    assert auto[0] == {"anchor": "Asthma", "positive": "wheezing and cough"}
    assert len(auto) == 2 and auto[1]["anchor"] in long and auto[1]["positive"] in long  # "short" skipped
    assert auto == list(iter_pretrain_pairs([CorpusSource(f)], crop, seed=1))
    assert list(iter_pretrain_pairs([CorpusSource(f, mode="title")], crop)) == auto[:1]
    assert all(p["anchor"] != "Asthma" for p in iter_pretrain_pairs([CorpusSource(f, mode="crop")], crop))
    # a BEIR folder reads its corpus.jsonl; max_pairs subsamples
    (tmp_path / "beir").mkdir()
    _write_corpus(tmp_path / "beir" / "corpus.jsonl", [{"_id": str(i), "title": f"t{i}", "text": f"x{i}"}
                                                        for i in range(50)])
    ds = pretrain_dataset([CorpusSource(tmp_path / "beir")], seed=3, max_pairs=10)
    assert ds.column_names == ["anchor", "positive"] and len(ds) == 10
    assert list(ds) == list(pretrain_dataset([CorpusSource(tmp_path / "beir")], seed=3, max_pairs=10))
    assert len(pretrain_dataset([CorpusSource(tmp_path / "beir")])) == 50  # streamed through from_generator
    with pytest.raises(DataError, match="not found"):
        list(iter_pretrain_pairs([CorpusSource(tmp_path / "missing.jsonl")]))
    bad = _write_corpus(tmp_path / "bad.jsonl", [{"_id": "x", "title": "t"}])
    with pytest.raises(DataError, match="bad.jsonl:1"):
        list(iter_pretrain_pairs([CorpusSource(bad)]))


# ------------------------------------------------------------------------------------------- stage II data
def test_beir_groups_mine_one_negative_from_top_100(tiny_bert, tiny_beir_dir):
    from medadapt.bmretriever import beir_groups, groups_to_dataset
    from medadapt.cache import EmbeddingCache
    from medadapt.curation import DenseSearcher, MiningConfig
    from medadapt.data import load_beir

    data = load_beir(tiny_beir_dir, ["train"])
    searcher = DenseSearcher(tiny_bert, data.doc_ids, data.doc_texts(), cache=EmbeddingCache(tiny_beir_dir / "c"),
                             show_progress=False)
    mining = MiningConfig.preset("bmretriever", text_dup_threshold=None, embedding_dup_threshold=None)
    groups = beir_groups(data, "train", searcher, mining, seed=0, show_progress=False)
    assert len(groups) == 12 and all(len(g.neg) == 1 and g.neg[0] not in g.pos for g in groups)
    again = beir_groups(data, "train", searcher, mining, seed=0, show_progress=False)
    assert [g.neg for g in groups] == [g.neg for g in again]
    few = beir_groups(data, "train", searcher, mining, max_queries=5, seed=0, show_progress=False)
    assert len(few) == 5
    ds = groups_to_dataset(groups)
    assert ds.column_names == ["anchor", "positive", "negative"] and len(ds) == 12
    assert groups_to_dataset(groups, hard_negatives=False).column_names == ["anchor", "positive"]


def test_groups_to_dataset_rows_and_task_prompts():
    from medadapt.bmretriever import groups_to_dataset
    from medadapt.data.training import TrainingGroup
    from medadapt.errors import DataError

    groups = [TrainingGroup("q1", ["p1", "p2"], ["n1"], prompt="Task A"), TrainingGroup("q2", ["p3"], [])]
    ds = groups_to_dataset(groups, query_template="{instruction}: ")
    assert ds["anchor"] == ["Task A: q1", "Task A: q1"] and ds["negative"] == ["n1", "n1"]  # q2 has no negative
    with pytest.raises(DataError):
        groups_to_dataset([])


def test_synthetic_generators_and_consistency_filter(tiny_bert, tiny_beir_dir):
    from medadapt.bmretriever import (
        FakeQueryGenerator,
        FakeTaskGenerator,
        QueryGenerator,
        TaskGenerator,
        synthesize_query_groups,
        synthesize_task_groups,
    )
    from medadapt.cache import EmbeddingCache
    from medadapt.curation import DenseSearcher
    from medadapt.data import load_beir

    data = load_beir(tiny_beir_dir, [])
    texts = data.doc_texts()
    gen = FakeQueryGenerator(noise=0.5, seed=1)
    assert isinstance(gen, QueryGenerator)
    queries = gen.generate_queries(texts, "instr")
    assert queries == FakeQueryGenerator(noise=0.5, seed=1).generate_queries(texts, "instr")
    assert all(q.startswith("what about ") for q in queries)

    class Oracle:  # a searcher that returns the passage a query was made from only for half of them
        def __call__(self, query_texts, k):
            return [[(data.doc_ids[i % 12], 1.0)] if i % 2 == 0 else [("d_none", 1.0)] for i, _ in
                    enumerate(query_texts)]

    text_to_id = {t: d for d, t in zip(data.doc_ids, texts)}
    kept = synthesize_query_groups(texts, FakeQueryGenerator(), "Find", Oracle(), text_to_id, top_k=3,
                                   show_progress=False)
    assert [g.pos[0] for g in kept] == texts[::2] and all(g.prompt == "Find" for g in kept)
    searcher = DenseSearcher(tiny_bert, data.doc_ids, texts, cache=EmbeddingCache(tiny_beir_dir / "c"),
                             show_progress=False)
    real = synthesize_query_groups(texts, gen, "Find", searcher, text_to_id, top_k=3, show_progress=False)
    assert len(real) <= len(texts)
    tasks = FakeTaskGenerator(TOPICS[:3])
    assert isinstance(tasks, TaskGenerator)
    groups = synthesize_task_groups(tasks, 4)
    assert len(groups) == 4 and groups[0].prompt.startswith("Given a question about diabetes")
    assert groups[0].neg and groups[0].neg[0].startswith("asthma")


# ------------------------------------------------------------------------------------------- model
def test_decoder_retriever_eos_pooling_prompts_and_lora(tiny_decoder_dir):
    import torch

    from medadapt.decoder import EosTransformer
    from medadapt.bmretriever import build_retriever
    from medadapt.errors import ConfigError
    from medadapt.recipes.base import LoraSection
    from medadapt.training.lora import attach_lora, merge_lora

    model = build_retriever(str(tiny_decoder_dir), "decoder", max_seq_length=32,
                            prompts={"query": "Q: ", "document": "P: "}, device="cpu")
    assert isinstance(model[0], EosTransformer) and model.similarity_fn_name == "dot"
    feats = model[0].preprocess(["asthma cough"])
    last = int(feats["attention_mask"][0].sum()) - 1
    assert int(feats["input_ids"][0, last]) == model[0].tokenizer.eos_token_id
    q = model.encode_query(["asthma"], convert_to_tensor=True)
    plain = model.encode(["Q: asthma"], convert_to_tensor=True)
    assert torch.allclose(q, plain, atol=1e-5)  # the query prompt is the instruction
    assert model.similarity(q, q).item() == pytest.approx(float(q[0] @ q[0]), rel=1e-5)  # dot product
    peft_model = attach_lora(model, LoraSection(r=2, alpha=4, dropout=0.0))
    config = peft_model.peft_config["default"]
    assert (config.r, config.lora_alpha, config.lora_dropout) == (2, 4, 0.0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with pytest.raises(ConfigError, match="already"):
        attach_lora(model, LoraSection())
    assert merge_lora(model) and not merge_lora(model)
    assert torch.allclose(model.encode_query(["asthma"], convert_to_tensor=True), q, atol=1e-5)  # B=0 at init


# ------------------------------------------------------------------------------------------- recipes
@pytest.mark.parametrize("name", ["410m", "1b", "2b", "7b", "tiny", "minilm"])
def test_shipped_recipes_validate(name):
    from medadapt.bmretriever import BmRetrieverRecipe
    from medadapt.recipes import load_recipe

    path = ROOT / "recipes" / f"bmretriever-{name}.yaml"
    recipe = load_recipe(path)  # the kind picks the schema
    assert type(recipe) is BmRetrieverRecipe and recipe.name == f"bmretriever-{name}"
    if name in ("410m", "1b", "2b", "7b"):
        m = recipe.model
        assert m.kind == "decoder" and m.lora.r == 16 and m.lora.alpha == 32 and m.max_seq_length == 512
        assert m.torch_dtype == "bfloat16" and m.gradient_checkpointing and not m.normalize
        assert recipe.stage1.epochs == 2 and recipe.stage2.epochs == 1
        assert recipe.stage1.warmup_steps == recipe.stage2.warmup_steps == 100
        assert recipe.stage1.warmup == 100 and recipe.stage1.scheduler == "linear"
        assert recipe.stage1.temperature == recipe.stage2.temperature == 1.0
        assert len(recipe.stage2.tasks) == 12
    paper = {"410m": (5e-5, 5e-5, 256), "1b": (5e-5, 5e-5, 256), "2b": (4e-5, 2e-5, 128), "7b": (2e-5, 1e-5, 64)}
    if name in paper:
        assert (recipe.stage1.lr, recipe.stage2.lr, recipe.stage1.batch_size) == paper[name]
    assert load_recipe(path, ["stage2.lr=0.5"]).stage2.lr == 0.5


def test_schema_errors_are_clear(tmp_path):
    from medadapt.bmretriever import BmRetrieverRecipe
    from medadapt.errors import ConfigError
    from medadapt.recipes import load_recipe

    path = ROOT / "recipes" / "bmretriever-tiny.yaml"
    with pytest.raises(ConfigError, match="stage1.bogus"):
        load_recipe(path, ["stage1.bogus=1"])
    with pytest.raises(ConfigError, match="model.kind"):
        load_recipe(path, ["model.kind=encoder"])
    with pytest.raises(ConfigError, match="no instruction"):
        load_recipe(path, ["stage2.tasks=[{name: mystery}]"])
    with pytest.raises(ConfigError, match="warmup_steps or warmup_ratio, not both"):
        load_recipe(path, ["stage1.warmup_ratio=0.1"])  # the file also gives warmup_steps
    with pytest.raises(ConfigError, match="not a BmRetrieverRecipe"):
        load_recipe(ROOT / "recipes" / "care-tiny.yaml", expect=BmRetrieverRecipe)


def test_stage_section_is_an_optim_section_with_the_papers_defaults():
    from medadapt.bmretriever import BmStageSection
    from medadapt.bmretriever.sections import Stage1Section
    from medadapt.training.config import OptimSection

    section = BmStageSection()
    assert isinstance(section, OptimSection)
    assert (section.lr, section.batch_size, section.warmup, section.scheduler, section.temperature) == \
        (5e-5, 256, 100, "linear", 1.0)
    ratio = Stage1Section(warmup_ratio=0.1)  # a ratio instead of the paper's 100 steps
    assert ratio.warmup_steps is None and ratio.warmup == pytest.approx(0.1)
    assert BmStageSection(epochs=0.5).epochs == 0.5  # the trainer takes fractional epochs
    with pytest.raises(ValueError, match="batch_size"):
        BmStageSection(batch_size=1)  # in-batch negatives need two rows


def test_recipe_built_in_python_equals_the_minimal_yaml(tmp_path):
    from medadapt.bmretriever import BmRetrieverRecipe
    from medadapt.bmretriever.sections import RetrieverModelSection
    from medadapt.recipes import DataSection, load_recipe

    path = tmp_path / "bmr-min.yaml"
    path.write_text("kind: bmretriever\nname: bmr-min\ndata: {path: medmini}\nmodel: {name: EleutherAI/pythia-410m}\n")
    from_yaml = load_recipe(path)
    built = BmRetrieverRecipe(name="bmr-min", data=DataSection(path="medmini"),
                              model=RetrieverModelSection(name="EleutherAI/pythia-410m"))
    assert type(from_yaml) is BmRetrieverRecipe
    assert from_yaml.model_dump() == built.model_dump()
    assert built.model.lora.r == 16 and built.model.lora.alpha == 32  # Appendix D = the LoraSection defaults
    assert built.stage1.enabled and not built.stage2.enabled
    assert built.eval_query_prompt() == built.instructions.pretrain_query  # no stage II task, no instruction


def _tiny_overrides(decoder, beir, bert) -> list[str]:
    return [f"model.name={decoder}", f"data.path={beir}", f"stage2.base_retriever={bert}"]


QUIET = {"show_progress": False, "log": lambda m: None}


def test_tiny_recipe_trains_both_stages_saves_and_resumes(tiny_decoder_dir, tiny_bert_dir, tiny_beir_dir, tmp_path):
    from medadapt.cache import EmbeddingCache
    from medadapt.errors import ConfigError
    from medadapt.models import load
    from medadapt.recipes import run_recipe

    recipe = ROOT / "recipes" / "bmretriever-tiny.yaml"
    out = tmp_path / "run"
    cache = EmbeddingCache(tmp_path / "cache")
    overrides = _tiny_overrides(tiny_decoder_dir, tiny_beir_dir, tiny_bert_dir)
    res = run_recipe(recipe, out, overrides, cache=cache, **QUIET)
    stages = res.details["stages"]
    assert stages["stage1"]["steps"] == 3 and stages["stage2"]["steps"] == 3  # 12 rows / batch 4
    assert stages["stage1"]["rows"] == stages["stage2"]["rows"] == 12
    assert [r["stage"] for r in res.loss_history] == ["stage1"] * 3 + ["stage2"] * 3
    assert [r["step"] for r in res.loss_history] == [1, 2, 3, 1, 2, 3]
    # warm-up over 1 step (the trainer's step 0 runs at lr 0), then linear decay to 0 over the 3 steps
    assert [r["lr"] for r in res.loss_history[:3]] == pytest.approx([0.0, 1e-3, 5e-4])
    log = json.loads((out / "train_log.json").read_text())
    assert log["num_processes"] == 1 and log["loss_history"] == res.loss_history and log["stages"] == stages
    assert json.loads((out / "metrics.json").read_text()) == pytest.approx(res.metrics, abs=1e-6)
    assert set(res.metrics) == {"ndcg@10", "recall@10"}
    model = load(str(out), device="cpu")
    assert model.prompts == {"query": "Find the answer\nQuery: ", "document": "passage: "}
    assert model.similarity_fn_name == "dot"
    assert not any("lora_" in n for n, _ in model.named_parameters())  # merged on save
    checkpoints = tmp_path / "run.checkpoints"  # beside the model folder
    assert (checkpoints / "stage1-model" / "modules.json").is_file() and not (out / "checkpoints").exists()
    # a re-run finds the finished stage I and trains only stage II
    again = run_recipe(recipe, out, overrides + ["stage2.enabled=false"], cache=cache, evaluate=False, **QUIET)
    assert again.details["stages"] == {"stage1": {"resumed": True}}
    stage1 = {n: p.detach().clone() for n, p in  # copies: the loaded tensors may map the file damaged below
              load(str(checkpoints / "stage1-model"), device="cpu").named_parameters()}
    weights = next(checkpoints.glob("stage1-model/**/model.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8])  # a damaged stage-I model is never loaded: stage I reruns
    from medadapt.errors import MedAdaptWarning

    with pytest.warns(MedAdaptWarning, match="stage I model: .*checksum differs"):
        redo = run_recipe(recipe, out, overrides + ["stage2.enabled=false"], cache=cache, evaluate=False, **QUIET)
    assert redo.details["stages"]["stage1"]["steps"] == 3
    rebuilt = load(str(checkpoints / "stage1-model"), device="cpu")
    for n, p in rebuilt.named_parameters():
        torch.testing.assert_close(p, stage1[n], atol=1e-6, rtol=0)  # the same stage I again
    # ... but not the stage I of another recipe
    with pytest.raises(ConfigError, match="another run"):
        run_recipe(recipe, out, overrides + ["stage2.enabled=false", "stage1.lr=0.01"], cache=cache,
                   evaluate=False, **QUIET)


def test_run_killed_inside_stage_ii_resumes_from_its_checkpoint(tiny_decoder_dir, tiny_bert_dir, tiny_beir_dir,
                                                               tmp_path, monkeypatch):
    """Killed after stage II's first step: the re-run reuses the stage-I model and resumes stage II from its
    loop checkpoint (LoRA weights, optimiser, schedule, data order), ending with the uninterrupted run's
    losses and model."""
    import medadapt.training.loop as loop
    from medadapt.cache import EmbeddingCache
    from medadapt.models import load
    from medadapt.recipes import run_recipe

    recipe = ROOT / "recipes" / "bmretriever-tiny.yaml"
    overrides = _tiny_overrides(tiny_decoder_dir, tiny_beir_dir, tiny_bert_dir) + ["training.checkpoint_every_steps=1"]
    cache = EmbeddingCache(tmp_path / "cache")
    whole = run_recipe(recipe, tmp_path / "whole", overrides, cache=cache, evaluate=False, **QUIET)
    real, calls = loop._one_step, [0]

    def dies(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 5:  # stage I's 3 steps, stage II's first: checkpoints up to stage II step 1
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "_one_step", dies)
    with pytest.raises(KeyboardInterrupt):
        run_recipe(recipe, tmp_path / "killed", overrides, cache=cache, evaluate=False, **QUIET)
    assert (tmp_path / "killed.checkpoints" / "stage2" / "step-00000001").is_dir()
    ran = []
    monkeypatch.setattr(loop, "_one_step", lambda *a, **k: ran.append(1) or real(*a, **k))
    resumed = run_recipe(recipe, tmp_path / "killed", overrides, cache=cache, evaluate=False, **QUIET)
    assert resumed.details["stages"]["stage1"] == {"resumed": True} and len(ran) == 2  # stage II steps 2, 3
    assert [r["loss"] for r in resumed.loss_history] == [r["loss"] for r in whole.loss_history]
    a, b = (load(str(tmp_path / k), device="cpu").encode_query(["asthma cough"]) for k in ("whole", "killed"))
    assert a.tolist() == b.tolist()


def test_stage2_training_beats_the_untrained_retriever(tiny_decoder_dir, tiny_bert_dir, tiny_beir_dir, tmp_path):
    """Instruction fine-tuning (stage II, 8 epochs of the 12 train queries with mined negatives) improves the
    tiny decoder on the held-out test queries. Measured nDCG@10 (on the one loop): 0.602 untrained, 0.729
    trained (0.704 with seed 1). Stage I alone does not help on this corpus, whose titles are bare disease
    names (0.560 after 8 epochs), as on MedQuAD in docs/bmretriever.md."""
    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import run_recipe

    recipe = ROOT / "recipes" / "bmretriever-tiny.yaml"
    overrides = _tiny_overrides(tiny_decoder_dir, tiny_beir_dir, tiny_bert_dir)
    cache = EmbeddingCache(tmp_path / "cache")
    untrained = run_recipe(recipe, tmp_path / "untrained", overrides + ["stage1.enabled=false",
                                                                        "stage2.enabled=false"], cache=cache, **QUIET)
    assert untrained.details["stages"] == {} and untrained.loss_history == []
    trained = run_recipe(recipe, tmp_path / "trained", overrides + ["stage1.enabled=false", "stage2.epochs=8"],
                         cache=cache, **QUIET)
    assert trained.details["stages"]["stage2"]["steps"] == 24
    assert trained.metrics["ndcg@10"] > untrained.metrics["ndcg@10"] + 0.05


def test_gradient_accumulation_trains_as_the_large_batch(tiny_decoder_dir):
    """``gradient_accumulation_steps = 2`` at batch 2 (the loop's GradCache) logs the losses of batch 4:
    in-batch negatives span the whole optimiser step."""
    from conftest import corpus_texts
    from medadapt.bmretriever import BmStageSection, build_retriever, train_stage

    texts = corpus_texts()
    data = {"anchor": texts[1::2], "positive": texts[0::2]}
    losses = []
    for section in (BmStageSection(batch_size=4, lr=1e-3, warmup_steps=0, no_duplicates=False, lora=False),
                    BmStageSection(batch_size=2, gradient_accumulation_steps=2, lr=1e-3, warmup_steps=0,
                                   no_duplicates=False, lora=False),
                    BmStageSection(batch_size=2, lr=1e-3, warmup_steps=0, no_duplicates=False, lora=False)):
        model = build_retriever(str(tiny_decoder_dir), "decoder", max_seq_length=32, device="cpu")
        res = train_stage(model, data, {}, section, seed=0)
        losses.append([r["loss"] for r in res.loss_history])
    big, accumulated, small = losses
    assert len(big) == len(accumulated) == 3 and len(small) == 6
    assert accumulated == pytest.approx(big, abs=1e-4)
    assert small[0] != pytest.approx(big[0], abs=1e-3)  # a plain batch of 2 is another objective


def test_the_stages_loss_is_sentence_transformers_dot_product_infonce():
    """Eq. 2-3 as the loop computes them, ``InfoNCELoss(tau, similarity="dot")``, equal sentence-transformers'
    ``MultipleNegativesRankingLoss(scale=1/tau, similarity_fct=dot_score)`` (the loss of the trainer it
    replaces), with and without hard negatives; the cosine form is another loss."""
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.util import dot_score

    from medadapt.losses import InfoNCELoss

    g = torch.Generator().manual_seed(0)
    q, p, n = (torch.randn(6, 8, generator=g) for _ in range(3))
    for tau in (1.0, 0.3):
        st = MultipleNegativesRankingLoss(torch.nn.Linear(1, 1), scale=1 / tau, similarity_fct=dot_score)
        ours = InfoNCELoss(tau, similarity="dot")
        assert float(ours(q, p)["infonce"]) == pytest.approx(float(st.compute_loss_from_embeddings([q, p], None)),
                                                             rel=1e-5)
        assert float(ours(q, p, n[:, None])["infonce"]) == pytest.approx(
            float(st.compute_loss_from_embeddings([q, p, n], None)), rel=1e-5)
    assert float(InfoNCELoss(1.0)(q, p)["infonce"]) != pytest.approx(float(InfoNCELoss(1.0, similarity="dot")(q, p)
                                                                           ["infonce"]), rel=1e-3)


def test_stage_batches_hold_one_data_set_no_duplicate_text_and_follow_the_sizes():
    """Stage II's sampler: each batch from one data set (its prompts), data sets in proportion to their size,
    a text never twice in a batch, last partial batches dropped, the same plan for the same seed."""
    from medadapt.bmretriever import BmStageSection, contrastive_stage

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

    big = {"anchor": [f"q{i % 5}" for i in range(20)], "positive": [f"p{i}" for i in range(20)],
           "negative": [f"n{i}" for i in range(20)]}
    small = {"anchor": [f"s{i}" for i in range(9)], "positive": [f"t{i}" for i in range(9)]}
    section = BmStageSection(batch_size=4, epochs=2, warmup_steps=1)
    prompts = {"big": {"anchor": "A: ", "positive": "P: ", "negative": "P: "}, "small": {"anchor": "S: "}}
    stage = contrastive_stage(Model(), {"big": big, "small": small}, prompts, section, seed=3)
    rows = stage.step.pairs
    for epoch in range(2):
        plan = stage.batches(epoch)
        parts = [{rows.part(i) for i in b} for b in plan]
        assert all(len(p) == 1 for p in parts) and all(len(b) == 4 for b in plan)
        assert sum(p == {1} for p in parts) == 2  # 9 // 4: the last partial batch is dropped
        assert 4 <= sum(p == {0} for p in parts) <= 5  # 20 // 4, fewer when duplicates are left over
        for b in plan:
            texts = [t for i in b for t in rows[i]]
            assert len(texts) == len(set(texts))  # q0..q4 repeat in the big set, never within a batch
    assert stage.steps() == len(stage.batches(0)) + len(stage.batches(1)) and stage.batches(0) != stage.batches(1)
    again = contrastive_stage(Model(), {"big": big, "small": small}, prompts, section, seed=3)
    assert again.batches(0) == stage.batches(0)
    assert stage.step.prompts(0) == ("A: ", "P: ") and stage.step.prompts(20) == ("S: ", "")
    assert stage.optim.epochs == 2 and int(stage.optim.warmup_ratio * stage.steps()) == 1
    half = contrastive_stage(Model(), {"big": big, "small": small}, prompts,
                             BmStageSection(batch_size=4, epochs=0.5, warmup_steps=0), seed=3)
    assert half.steps() == -(-len(half.batches(0)) // 2)  # ceil(0.5 x the batches of an epoch)


def test_stage2_datasets_with_synthetic_pairs(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from medadapt.bmretriever import stage1_dataset, stage2_datasets
    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "bmretriever-tiny.yaml", _tiny_overrides(
        "unused", tiny_beir_dir, tiny_bert_dir) + ["stage2.synthetic={generator: fake, passages: 12, top_k: 12}"])
    s1 = stage1_dataset(recipe)
    assert len(s1) == 12 and s1[0]["anchor"] == "diabetes"  # title -> text pairs of the BEIR corpus
    data, prompts = stage2_datasets(recipe, cache=EmbeddingCache(tmp_path / "c"), show_progress=False,
                                    log=lambda m: None)
    assert set(data) == {"medquad", "synthetic"}
    assert len(data["synthetic"]) == 12  # top_k = corpus size: every generated pair passes the filter
    assert data["synthetic"].column_names == ["anchor", "positive", "negative"]
    assert prompts["synthetic"]["anchor"] == ("Given a question, retrieve Pubmed passages that answer the "
                                              "question.\nQuery: ")
    assert prompts["medquad"] == {"anchor": "Find the answer\nQuery: ", "positive": "passage: ",
                                  "negative": "passage: "}


def test_gradient_checkpointing_with_lora_still_trains_the_adapter(tiny_decoder_dir):
    import torch

    from medadapt.bmretriever import build_retriever
    from medadapt.recipes.base import LoraSection
    from medadapt.training.lora import attach_lora, first_transformer

    model = build_retriever(str(tiny_decoder_dir), "decoder", max_seq_length=32, device="cpu")
    attach_lora(model, LoraSection(r=2, alpha=4, dropout=0.0), gradient_checkpointing=True)
    hf = first_transformer(model).model
    assert hf.base_model.model.is_gradient_checkpointing
    model.train()
    feats = model.preprocess(["asthma cough", "gout toe"])
    emb = model(feats)["sentence_embedding"]
    (emb @ emb.T).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert any(float(g.abs().sum()) > 0 for g in grads.values())


def test_lora_on_a_half_precision_decoder_is_float32_throughout_under_fsdp(tiny_decoder_dir, monkeypatch):
    """FSDP flattens one dtype per wrapped module: a bf16 decoder with PEFT's float32 LoRA matrices failed
    on an H100 ("Must flatten tensors with uniform dtype"). Under FSDP attach_lora upcasts (and says so);
    elsewhere the half-precision weights stay."""
    import torch

    from medadapt.bmretriever import build_retriever
    from medadapt.errors import MedAdaptWarning
    from medadapt.recipes.base import LoraSection
    from medadapt.training.lora import attach_lora

    def dtypes(fsdp: bool):
        if fsdp:
            monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
        else:
            monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
        model = build_retriever(str(tiny_decoder_dir), "decoder", torch_dtype="bfloat16", device="cpu")
        attach_lora(model, LoraSection(r=2, alpha=4, dropout=0.0))
        return {p.dtype for p in model.parameters()}

    assert dtypes(False) == {torch.bfloat16, torch.float32}
    with pytest.warns(MedAdaptWarning, match="FSDP flattens parameters of one dtype"):
        assert dtypes(True) == {torch.float32}
