"""Benchmark suites (medadapt.eval.suites): every suite end to end on tiny fixtures written in each layout,
the papers' averages against hand computation (and the papers' own numbers), cross-lingual CURE reported
per query language with language warnings, and one clear error per kind of bad input."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medadapt.errors import DataError, MedAdaptError, MedAdaptWarning

pytestmark = pytest.mark.usefixtures("_single_thread")

WORDS = ["diabetes insulin glucose", "asthma inhaler wheezing", "migraine headache aura", "eczema itchy rash",
         "gout uric toe", "anemia iron pale", "insomnia sleep night", "influenza fever flu"]


# ----------------------------------------------------------------------------------------------- writers


def write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def write_beir_task(root: Path, n_docs: int = 4, languages: tuple[str, ...] | None = None, split: str = "test",
                    offset: int = 0) -> Path:
    """A BEIR folder; ``languages`` writes ``queries-<lang>.jsonl`` (CURE) instead of ``queries.jsonl``.
    Query i is relevant (grade 2) to doc i and partly relevant (grade 1) to doc i+1."""
    docs = [WORDS[(offset + i) % len(WORDS)] for i in range(n_docs)]
    write_jsonl(root / "corpus.jsonl", [{"_id": f"d{i}", "title": "", "text": f"{t} is a condition"}
                                        for i, t in enumerate(docs)])
    queries = {f"q{i}": f"symptoms of {docs[i].split()[0]}" for i in range(n_docs - 1)}
    for lang in languages or (None,):
        texts = dict(queries)
        if lang == "fr":  # a poor "translation": every query names the next query's topic, so scores differ
            texts = {f"q{i}": f"symptomes {docs[(i + 1) % (n_docs - 1)].split()[0]}" for i in range(n_docs - 1)}
        elif lang == "es":
            texts = {q: f"{t} sintomas" for q, t in texts.items()}
        write_jsonl(root / (f"queries-{lang}.jsonl" if lang else "queries.jsonl"),
                    [{"_id": q, "text": t} for q, t in texts.items()])
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t2\nq{i}\td{i + 1}\t1" for i in range(n_docs - 1)]
    (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def write_mteb_rerank(path: Path, n: int = 3) -> Path:
    """MTEB's reranking rows: {query, positive: [...], negative: [...]}."""
    return write_jsonl(path, [{"query": f"what helps {WORDS[i].split()[0]}",
                               "positive": [f"{WORDS[i]} treatment"],
                               "negative": [f"{WORDS[(i + 1) % 8]} advice", f"{WORDS[(i + 2) % 8]} care"]}
                              for i in range(n)])


def write_sts(path: Path) -> Path:
    return write_jsonl(path, [{"sentence1": WORDS[i], "sentence2": WORDS[(i + k) % 8], "score": float(4 - k)}
                              for i in range(4) for k in range(3)])


def write_pool(path: Path) -> Path:
    return write_jsonl(path, [{"query": f"what is {WORDS[i].split()[0]}", "positives": [WORDS[i]],
                               "negatives": [WORDS[(i + 4) % 8]], "id": f"p{i}"} for i in range(3)])


def write_relish(path: Path) -> Path:
    return write_jsonl(path, [{"query": WORDS[i], "id": f"r{i}",
                               "candidates": [{"text": WORDS[i] + " study", "grade": 2},
                                              {"text": WORDS[(i + 1) % 8], "grade": 1},
                                              {"text": WORDS[(i + 3) % 8], "grade": 0}]} for i in range(3)])


def make_cmedteb(root: Path) -> Path:
    for name in ("CMedQAv1-reranking", "CMedQAv2-reranking", "CMedTEB-Rerank"):
        write_mteb_rerank(root / name / "test.jsonl")
    write_beir_task(root / "CMedTEB-Retrieval")
    write_sts(root / "CMedTEB-STS" / "test.jsonl")
    return root


def make_cure(root: Path, with_all: bool = False) -> Path:
    from medadapt.eval.suites.cure import DOMAINS

    for i, slug in enumerate(list(DOMAINS) + (["all"] if with_all else [])):
        write_beir_task(root / slug, n_docs=3, languages=("en", "es", "fr"), offset=i)
    return root


def make_bmretriever(root: Path) -> Path:
    for i, name in enumerate(("nfcorpus", "scifact", "scidocs", "trec-covid")):
        write_beir_task(root / name, offset=i)
    write_sts(root / "biosses" / "test.jsonl")
    for name in ("bioasq", "pubmedqa", "icliniq", "drugbank", "mesh"):
        write_pool(root / name / "test.jsonl")
    write_relish(root / "relish" / "test.jsonl")
    return root


def make_medmoe(root: Path) -> Path:
    for i, name in enumerate(("MPD-Title", "MPD-RP", "MMD", "MCQA-Retri")):
        write_beir_task(root / name, n_docs=5, offset=i)
    return root


@pytest.fixture()
def model(tiny_bert):
    tiny_bert.model_card_data.language = ["en", "zh", "fr", "es"]
    return tiny_bert


@pytest.fixture()
def cache(tmp_path):
    from medadapt.cache import EmbeddingCache

    return EmbeddingCache(tmp_path / "cache")


def _mean(xs):
    xs = list(xs)
    return math.fsum(xs) / len(xs)


# ----------------------------------------------------------------------------------------------- averages


def test_paper_averages_reproduce_the_papers_tables():
    """The averages are computed as the papers do: their own per-task numbers give their printed means."""
    from medadapt.eval.suites import TaskRow, compute_averages, get_suite

    def rows(suite, scores):
        spec = get_suite(suite)
        return [TaskRow(t.name, t.family, t.query_languages[0], t.corpus_language, t.main_metric,
                        {t.main_metric: scores[t.name]}) for t in spec.tasks if t.name in scores]

    # CARE Table 2, bge-small-zh-v1.5: 80.21 81.69 44.33 62.30 70.50 -> Avg 67.81
    bge = {"CMedQAv1-reranking": 0.8021, "CMedQAv2-reranking": 0.8169, "CMedTEB-Retrieval": 0.4433,
           "CMedTEB-Rerank": 0.6230, "CMedTEB-STS": 0.7050}
    avg = compute_averages(get_suite("cmedteb"), rows("cmedteb", bge))
    assert avg["avg"] == pytest.approx(0.6781, abs=5e-5)
    # CARE Table 11, gte-multilingual-base: 86.11 87.40 | 47.80 61.51 72.39 -> 86.76, 60.57
    gte = {"CMedQAv1-reranking": 0.8611, "CMedQAv2-reranking": 0.8740, "CMedTEB-Retrieval": 0.4780,
           "CMedTEB-Rerank": 0.6151, "CMedTEB-STS": 0.7239}
    avg = compute_averages(get_suite("cmedteb"), rows("cmedteb", gte))
    assert avg["avg_cmed"] == pytest.approx(0.8676, abs=5e-5) and avg["avg_new"] == pytest.approx(0.6057, abs=5e-5)
    # BMRetriever Table 2, BMRetriever-410M: 0.321 0.711 0.167 0.831 | BIOSSES 0.840 -> 0.508, 0.574
    bm = {"nfcorpus": 0.321, "scifact": 0.711, "scidocs": 0.167, "trec-covid": 0.831, "biosses": 0.840}
    avg = compute_averages(get_suite("bmretriever"), rows("bmretriever", bm))
    # (the inputs are themselves rounded to 3 digits: agreement to half a unit of the last printed digit)
    assert avg["avg_retr"] == pytest.approx(0.508, abs=5.01e-4) and avg["avg_all"] == pytest.approx(0.574, abs=5.01e-4)
    # a left-out task leaves the averages that need it undefined, not silently re-weighted
    del bm["biosses"]
    avg = compute_averages(get_suite("bmretriever"), rows("bmretriever", bm))
    assert avg["avg_all"] is None and avg["avg_retr"] == pytest.approx(0.5075)


# ----------------------------------------------------------------------------------------------- suites end to end


def test_cmedteb_end_to_end(tmp_path, model, cache):
    from medadapt.eval import evaluate_rerank, evaluate_sts
    from medadapt.eval.suites import evaluate_suite
    from medadapt.eval.suites.cmedteb import RERANK, STS
    from medadapt.eval.tasks.rerank import load_mteb_rerank
    from medadapt.data import load_sts

    root = make_cmedteb(tmp_path / "cmedteb")
    prompts_before = dict(model.prompts)
    res = evaluate_suite("cmedteb", model, root, cache=cache, model_name="tiny", instructions="on")
    assert [r.task for r in res.rows] == ["CMedQAv1-reranking", "CMedQAv2-reranking", "CMedTEB-Retrieval",
                                         "CMedTEB-Rerank", "CMedTEB-STS"]
    assert model.prompts == prompts_before  # the task prompts were put back
    main = [r.main_score for r in res.rows]
    assert res.averages["avg"] == pytest.approx(_mean(main), abs=1e-12)
    assert res.averages["avg_cmed"] == pytest.approx(_mean(main[:2]), abs=1e-12)
    assert res.averages["avg_new"] == pytest.approx(_mean(main[2:]), abs=1e-12)
    assert res.row("CMedTEB-STS").main_metric == "pearson"
    assert res.row("CMedTEB-Retrieval").query_prompt == (
        "Instruct: Given a Chinese medical question, retrieve medical documents that answer the question.\nQuery: ")

    # each number is the existing evaluator's, with Table 6's instruction as the query prompt
    items = load_mteb_rerank(root / "CMedTEB-Rerank" / "test.jsonl")
    model.prompts = {**prompts_before, "query": f"Instruct: {RERANK}\nQuery: "}
    assert res.row("CMedTEB-Rerank").metrics["map@10"] == pytest.approx(evaluate_rerank(model, items)["map@10"])
    pairs = load_sts(root / "CMedTEB-STS" / "test.jsonl")
    model.prompts = {**prompts_before, "query": f"Instruct: {STS}\nQuery: "}
    with_instr = evaluate_sts(model, pairs, route="query")["pearson"]  # both sentences get the instruction
    model.prompts = prompts_before
    assert res.row("CMedTEB-STS").main_score == pytest.approx(with_instr, abs=1e-6)
    plain = evaluate_suite("cmedteb", model, root, cache=cache, instructions=False, tasks=["CMedTEB-STS"])
    assert plain.row("CMedTEB-STS").main_score == pytest.approx(evaluate_sts(model, pairs)["pearson"], abs=1e-6)
    assert plain.row("CMedTEB-STS").main_score != pytest.approx(with_instr, abs=1e-6)
    assert plain.averages["avg"] is None and plain.averages["avg_new"] is None


def test_cure_cross_lingual_per_language_and_domain(tmp_path, model, cache, monkeypatch):
    from medadapt.data.beir import BeirDataset, load_corpus, load_qrels, load_queries
    from medadapt.eval import evaluate_retrieval
    from medadapt.eval.suites import evaluate_suite
    from medadapt.eval.suites.cure import DOMAINS, INSTRUCTION

    root = make_cure(tmp_path / "cure", with_all=True)
    res = evaluate_suite("cure", model, root, cache=cache, instructions="on")
    assert len(res.rows) == 11 * 3 and {r.query_language for r in res.rows} == {"en", "es", "fr"}
    assert all(r.corpus_language == "en" for r in res.rows)
    assert res.row("dermatology", "fr").label == "dermatology (fr->en)"
    # one cross-lingual cell, recomputed with the plain retrieval evaluator
    d = root / "dermatology"
    data = BeirDataset(load_corpus(d / "corpus.jsonl"), load_queries(d / "queries-fr.jsonl"),
                       {"test": load_qrels(d / "qrels" / "test.tsv")})
    model.prompts = {"query": f"Instruct: {INSTRUCTION}\nQuery: "}
    ref = evaluate_retrieval(model, data, "test", ["ndcg@10", "recall@100"], cache=cache, show_progress=False)
    model.prompts = {}
    assert res.row("dermatology", "fr").metrics == pytest.approx(ref, abs=1e-9)
    assert res.row("dermatology", "fr").metrics["recall@100"] == 1.0  # 3 docs: everything is retrieved
    # each language's own queries file is what gets encoded, with the instruction as the query prompt
    import medadapt.eval.retrieval as retrieval

    seen, real = [], retrieval.evaluate_retrieval

    def spy(model_, data_, split_, *args, **kwargs):
        seen.append((sorted(data_.split_queries(split_).values()), model_.prompts.get("query")))
        return real(model_, data_, split_, *args, **kwargs)

    monkeypatch.setattr(retrieval, "evaluate_retrieval", spy)
    evaluate_suite("cure", model, root, cache=cache, tasks=["dermatology"], instructions="on")
    texts = {lang: sorted(load_queries(d / f"queries-{lang}.jsonl").values()) for lang in ("en", "es", "fr")}
    assert len({tuple(t) for t in texts.values()}) == 3  # the three files differ
    assert seen == [(texts[lang], f"Instruct: {INSTRUCTION}\nQuery: ") for lang in ("en", "es", "fr")]
    # per-language means over the ten domains ("all" is reported, not averaged), and the overall mean
    for metric in ("ndcg@10", "recall@100"):
        for lang in ("en", "es", "fr"):
            by_hand = _mean(res.row(dom, lang).metrics[metric] for dom in DOMAINS)
            assert res.averages[f"{metric}/{lang}"] == pytest.approx(by_hand, abs=1e-12)
        assert res.averages[metric] == pytest.approx(
            _mean(res.row(dom, lang).metrics[metric] for dom in DOMAINS for lang in ("en", "es", "fr")), abs=1e-12)
    assert res.row("all", "en").family.startswith("All")


def test_cure_warns_about_undeclared_query_languages(tmp_path, tiny_bert, cache):
    from medadapt.eval.suites import evaluate_suite

    root = make_cure(tmp_path / "cure")
    tiny_bert.model_card_data.language = "en"
    with pytest.warns(MedAdaptWarning) as record:
        res = evaluate_suite("cure", tiny_bert, root, cache=cache, tasks=["genetics"])
    text = " ".join(str(w.message) for w in record)
    assert "'es'" in text and "'fr'" in text and "'en'" not in text
    assert len(res.warnings) == 2 and len(res.rows) == 3
    tiny_bert.model_card_data.language = None
    with pytest.warns(MedAdaptWarning, match="declares no language"):
        evaluate_suite("cure", tiny_bert, root, cache=cache, tasks=["genetics"])
    tiny_bert.model_card_data.language = ["eng", "fr-FR", "Spanish"]  # other spellings of the same languages
    with warnings.catch_warnings():
        warnings.simplefilter("error", MedAdaptWarning)
        assert evaluate_suite("cure", tiny_bert, root, cache=cache, tasks=["genetics"]).warnings == []


def test_bmretriever_end_to_end(tmp_path, model, cache):
    from medadapt.bmretriever.instructions import EVAL_INSTRUCTIONS, PASSAGE_PROMPT, QUERY_TEMPLATE
    from medadapt.eval.suites import evaluate_suite
    from medadapt.eval.suites import bmretriever as suite

    # the neutral copy of the instruction tables agrees with the BMRetriever system's
    assert suite.INSTRUCTIONS == EVAL_INSTRUCTIONS and suite.PASSAGE_PROMPT == PASSAGE_PROMPT
    assert suite.QUERY_TEMPLATE == QUERY_TEMPLATE
    res = evaluate_suite("bmretriever", model, make_bmretriever(tmp_path / "bm"), cache=cache, instructions="on")
    assert len(res.rows) == 11
    assert set(res.row("drugbank").metrics) == {"recall@1", "recall@5", "mrr@5"}
    assert set(res.row("bioasq").metrics) == {"recall@5", "recall@20", "ndcg@20"}
    assert set(res.row("relish").metrics) == {"map", "ndcg"}
    assert res.row("bioasq").metrics["recall@20"] == 1.0  # a 6-passage pool: every positive is in the top 20
    assert res.row("scifact").document_prompt == "Represent this passage. Passage: "
    ir = [res.row(t).metrics["ndcg@10"] for t in ("nfcorpus", "scifact", "scidocs", "trec-covid")]
    assert res.averages["avg_retr"] == pytest.approx(_mean(ir), abs=1e-12)
    assert res.averages["avg_all"] == pytest.approx(_mean(ir + [res.row("biosses").metrics["spearman"]]), abs=1e-12)


def test_medmoe_end_to_end(tmp_path, model, cache):
    from medadapt.eval.suites import evaluate_suite

    res = evaluate_suite("medmoe", model, make_medmoe(tmp_path / "moe"), cache=cache)
    assert [r.task for r in res.rows] == ["MPD-Title", "MPD-RP", "MMD", "MCQA-Retri"]
    for r in res.rows:
        m = r.metrics
        assert set(m) == {"recall@10", "precision@10", "paper_f1@10", "paper_map@10", "paper_accuracy@10",
                          "f1@10", "map@10", "accuracy@10"}
        assert r.main_metric == "paper_f1@10"
        # 5 docs, 2 relevant per query, all retrieved: recall 1; precision@10 = 2/10 (trec_eval divides by k);
        # F1 = 2PR/(P+R) = 0.4/1.2 = 1/3 both ways (every query alike); no judged non-relevant documents:
        # paper_accuracy is the recall; AP normalised by the 2 relevant retrieved is at least trec's
        assert m["recall@10"] == 1.0 and m["precision@10"] == pytest.approx(0.2)
        assert m["f1@10"] == pytest.approx(1 / 3) and m["paper_f1@10"] == pytest.approx(1 / 3)
        assert m["accuracy@10"] == 1.0 and m["paper_accuracy@10"] == 1.0
        assert m["paper_map@10"] == pytest.approx(m["map@10"])  # every relevant document is retrieved
        assert r.query_prompt is None
    assert res.row("MMD").query_language == "zh" and res.averages == {}


def test_cli_suite_writes_json_table_and_plot(tmp_path, tiny_bert_dir, monkeypatch):
    from medadapt.cli import app

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    root = make_medmoe(tmp_path / "moe")
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    with pytest.warns(MedAdaptWarning, match="declares no language"):
        result = CliRunner().invoke(app, ["eval", "--suite", "medmoe", "--data-dir", str(root), "--model",
                                          str(tiny_bert_dir), "--output", str(out), "--plot", str(png), "-q",
                                          "--suite-tasks", "MPD-Title,MMD"])
    assert result.exit_code == 0, result.output
    assert "MPD-Title" in result.output and "f1@10" in result.output
    data = json.loads(out.read_text())
    assert data["suite"] == "medmoe" and [t["task"] for t in data["tasks"]] == ["MPD-Title", "MMD"]
    assert data["tasks"][0]["metrics"]["f1@10"] == pytest.approx(1 / 3, abs=1e-6)
    assert any("declares no language" in w for w in data["warnings"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------------------------- bad input


def test_missing_task_names_the_expected_path(tmp_path, model):
    import shutil

    from medadapt.eval.suites import evaluate_suite

    root = make_cmedteb(tmp_path / "cmedteb")
    shutil.rmtree(root / "CMedTEB-STS")
    with pytest.raises(DataError, match=r"task CMedTEB-STS is missing .*CMedTEB-STS[/\\]test\.jsonl"):
        evaluate_suite("cmedteb", model, root)
    shutil.rmtree(root / "CMedTEB-Retrieval")
    with pytest.raises(DataError, match=r"task CMedTEB-Retrieval is missing .*BEIR folder"):
        evaluate_suite("cmedteb", model, root)


def test_task_without_qrels_for_the_split(tmp_path, model):
    from medadapt.eval.suites import evaluate_suite

    root = make_cure(tmp_path / "cure")
    (root / "pulmonology" / "qrels" / "test.tsv").rename(root / "pulmonology" / "qrels" / "dev.tsv")
    with pytest.raises(DataError, match=r"pulmonology: no qrels for split 'test': .*pulmonology[/\\]qrels[/\\]"
                                        r"test\.tsv not found \(qrels splits there: dev\)"):
        evaluate_suite("cure", model, root)
    # rerank / STS tasks: no file for the split
    root = make_cmedteb(tmp_path / "cmedteb")
    with pytest.raises(DataError, match=r"CMedQAv1-reranking: no file for split 'dev'.*found: test\.jsonl"):
        evaluate_suite("cmedteb", model, root, split="dev", tasks=["CMedQAv1-reranking"])


def test_queries_of_one_language_missing_ids(tmp_path, model):
    from medadapt.eval.suites import evaluate_suite

    root = make_cure(tmp_path / "cure")
    write_jsonl(root / "genetics" / "queries-es.jsonl", [{"_id": "q0", "text": "x"}])
    with pytest.raises(DataError, match=r"query id\(s\) not in .*genetics[/\\]queries-es\.jsonl"):
        evaluate_suite("cure", model, root)


def test_rerank_file_in_the_wrong_layout(tmp_path, model):
    from medadapt.eval.suites import evaluate_suite

    root = make_cmedteb(tmp_path / "cmedteb")
    bad = write_jsonl(root / "CMedTEB-Rerank" / "test.jsonl",
                      [{"query": "q", "candidates": [{"text": "a", "grade": 1}]}])
    with pytest.raises(DataError, match=r"CMedTEB-Rerank[/\\]test\.jsonl:1: not MTEB's reranking layout.*"
                                        r"medadapt's own rerank format"):
        evaluate_suite("cmedteb", model, root)
    write_jsonl(bad, [{"query": "q", "positive": "a", "negative": [1]}])
    with pytest.raises(DataError, match=r"test\.jsonl:1: 'negative' must be a list of strings"):
        evaluate_suite("cmedteb", model, root)


def test_cli_bad_suite_input_is_one_error_line(tmp_path, tiny_bert_dir):
    from medadapt.cli import app

    root = make_cmedteb(tmp_path / "cmedteb")
    write_jsonl(root / "CMedQAv2-reranking" / "test.jsonl", [{"query": "q", "candidates": []}])
    runner = CliRunner()
    for args, expected in (
        (["--suite", "cmedteb", "--data-dir", str(root)], "CMedQAv2-reranking"),
        (["--suite", "nope", "--data-dir", str(root)], "unknown suite 'nope'; choose from cmedteb, cure"),
        (["--suite", "cmedteb"], "--suite and --data-dir go together"),
        (["--suite", "cmedteb", "--data-dir", str(root), "--metrics", "ndcg@10"], "--metrics does not apply"),
        (["--suite", "cmedteb", "--data-dir", str(root), "--task", "rerank"], "--task and --mteb-output do not"),
    ):
        result = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), *args])
        assert result.exit_code == 1, result.output
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.output
        assert "Traceback" not in result.output


def test_language_codes_and_prompt_restore(tiny_bert):
    from medadapt.eval.suites import declared_languages
    from medadapt.eval.suites.base import normalize_language, task_prompts

    assert [normalize_language(c) for c in ("en-US", "eng", "English", "zh-Hans", "fra", "es_ES")] == \
        ["en", "en", "en", "zh", "fr", "es"]
    tiny_bert.model_card_data.language = ["multilingual"]
    assert declared_languages(tiny_bert) == {"*"}
    tiny_bert.model_card_data.language = None
    assert declared_languages(tiny_bert) is None
    tiny_bert.prompts = {"query": "mine: ", "passage": "p: "}
    with task_prompts(tiny_bert, "Q: ", "D: "):
        assert tiny_bert.prompts == {"query": "Q: ", "document": "D: "}
    assert tiny_bert.prompts == {"query": "mine: ", "passage": "p: "}
    with pytest.raises(RuntimeError), task_prompts(tiny_bert, "Q: ", None):
        assert tiny_bert.prompts == {"query": "Q: ", "passage": "p: "}
        raise RuntimeError("boom")
    assert tiny_bert.prompts == {"query": "mine: ", "passage": "p: "}
    with pytest.raises(MedAdaptError, match="unknown suite"):
        from medadapt.eval.suites import get_suite

        get_suite("cmedteb2")


# ----------------------------------------------------------------------------------------------- instructions


def test_instructions_only_for_a_model_declared_instruction_aware(tmp_path, model, cache):
    """auto: a model without an instruction prompt (the tiny BERT: empty prompts) scores as with instructions
    off, and differently from on; a model whose saved query prompt is an instruction prompt gets them."""
    from medadapt.eval.suites import evaluate_suite, instruction_aware

    root = make_cmedteb(tmp_path / "cmedteb")
    tasks = ["CMedTEB-Retrieval", "CMedTEB-STS"]
    assert model.prompts.get("query", "") == "" and instruction_aware(model)[0] is False
    auto = evaluate_suite("cmedteb", model, root, cache=cache, tasks=tasks)
    off = evaluate_suite("cmedteb", model, root, cache=cache, tasks=tasks, instructions="off")
    on = evaluate_suite("cmedteb", model, root, cache=cache, tasks=tasks, instructions="on")
    assert [r.metrics for r in auto.rows] == [r.metrics for r in off.rows]
    assert all(r.query_prompt is None for r in auto.rows)
    assert on.row("CMedTEB-STS").main_score != pytest.approx(auto.row("CMedTEB-STS").main_score, abs=1e-6)
    assert auto.instructions == {"mode": "auto", "applied": False,
                                 "reason": "the model has no query prompt, so it is not declared instruction-aware"}
    assert on.to_dict()["instructions"]["applied"] is True and off.to_dict()["instructions"]["mode"] == "off"
    assert evaluate_suite("cmedteb", model, root, cache=cache, tasks=tasks, instructions=False).instructions == \
        off.instructions

    # a fixed prefix (E5's "query: ") is not an instruction prompt: kept, no paper instruction
    model.prompts = {"query": "query: ", "document": "passage: "}
    fixed = evaluate_suite("cmedteb", model, root, cache=cache, tasks=tasks)
    assert fixed.instructions["applied"] is False and "fixed prefix" in fixed.instructions["reason"]
    assert model.prompts == {"query": "query: ", "document": "passage: "}
    # an instruction prompt (BMRetriever's "{instruction}\nQuery: ", Qwen3's "Instruct: ...") declares it
    for prompt in ("Given a question, retrieve passages that answer it\nQuery: ",
                   "Instruct: Given a web search query, retrieve relevant passages\nQuery:"):
        model.prompts = {"query": prompt}
        aware = evaluate_suite("cmedteb", model, root, cache=cache, tasks=tasks)
        assert aware.instructions["applied"] is True
        assert [r.metrics for r in aware.rows] == [r.metrics for r in on.rows]
        assert aware.row("CMedTEB-Retrieval").query_prompt.startswith("Instruct: Given a Chinese medical question")
    with pytest.raises(MedAdaptError, match="instructions must be one of auto, on, off, got 'yes'"):
        evaluate_suite("cmedteb", model, root, cache=cache, tasks=tasks, instructions="yes")


def test_suite_scores_match_the_mteb_package(tmp_path, model, cache):
    """The suite's retrieval score equals the mteb package's on the same folder: instructions auto (none for
    the tiny model) against mteb with the model's own prompts, and on against mteb with the instruction as
    the model's query prompt."""
    pytest.importorskip("mteb")
    from medadapt.eval.mteb import local_retrieval_task, run_mteb
    from medadapt.eval.suites import evaluate_suite

    root = make_cmedteb(tmp_path / "cmedteb")
    write_beir_task(root / "CMedTEB-Retrieval", n_docs=8)
    task = ["CMedTEB-Retrieval"]
    auto = evaluate_suite("cmedteb", model, root, cache=cache, tasks=task).row("CMedTEB-Retrieval")
    on = evaluate_suite("cmedteb", model, root, cache=cache, tasks=task, instructions="on").row("CMedTEB-Retrieval")
    assert abs(auto.main_score - on.main_score) > 1e-3  # the instruction changes the ranking: the check has power
    folder = local_retrieval_task(root / "CMedTEB-Retrieval", "test")
    assert run_mteb(model, folder)["main_score"] == pytest.approx(auto.main_score, abs=2e-3)
    model.prompts = {"query": on.query_prompt}
    assert run_mteb(model, folder)["main_score"] == pytest.approx(on.main_score, abs=2e-3)


def test_cli_instructions_flag(tmp_path, tiny_bert_dir, monkeypatch):
    from medadapt.cli import app

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    root = make_cmedteb(tmp_path / "cmedteb")
    runner = CliRunner()
    base = ["eval", "--model", str(tiny_bert_dir), "--suite", "cmedteb", "--data-dir", str(root), "-q",
            "--suite-tasks", "CMedTEB-STS"]
    found, printed = {}, {}
    for flag in ([], ["--instructions", "on"], ["--instructions", "off"], ["--no-instructions"]):
        out = tmp_path / f"r{len(found)}.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MedAdaptWarning)
            result = runner.invoke(app, [*base, *flag, "--output", str(out)])
        assert result.exit_code == 0, result.output
        found[" ".join(flag)] = json.loads(out.read_text())
        printed[" ".join(flag)] = " ".join(result.output.split())
    assert found[""]["instructions"] == {"mode": "auto", "applied": False, "reason": "the model has no query "
                                         "prompt, so it is not declared instruction-aware"}
    assert "instructions off (auto): the model has no query prompt" in printed[""]  # the table's caption
    assert "instructions on (on)" in printed["--instructions on"]
    assert found["--instructions on"]["tasks"][0]["query_prompt"].startswith("Instruct: Retrieve semantically")
    assert found["--instructions off"]["tasks"] == found[""]["tasks"] == found["--no-instructions"]["tasks"]
    for args, expected in (([*base, "--no-instructions", "--instructions", "on"], "--no-instructions"),
                           (["eval", "--model", str(tiny_bert_dir), "--instructions", "on"], "--instructions")):
        result = runner.invoke(app, args)
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]
