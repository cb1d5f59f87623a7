"""Synonym STS triplets (CMedTEB §3.1) with a deterministic fake generator."""

from __future__ import annotations

import json

import pytest

from medadapt.curation import PromptGenerator, StsReport, build_sts_triplets, load_synonyms, to_sts_pairs
from medadapt.curation.sts_triplets import synonym_pairs
from medadapt.data import load_sts
from medadapt.errors import DataError


def fake_generator(ex):
    return {
        "positive": ex.replace_query.replace("？", "呢？"),
        "hard_negative": f"{ex.replace}会遗传吗？",
        "easy_negative": f"{ex.origin}的病因是什么？",
    }


SYN = {"高血压": ["血压高"], "糖尿病": ["消渴"]}
SENTS = ["高血压患者能吃党参吗？", "高血压需要终身服药吗？", "糖尿病饮食要注意什么？", "感冒了怎么办？"]


def test_builds_triplets_from_dictionary_and_generator():
    report = StsReport()
    trips = build_sts_triplets(SYN, SENTS, fake_generator, per_pair=1, show_progress=False, report=report)
    # (高血压->血压高) and (糖尿病->消渴) find sentences; the reverse directions find none
    assert report.pairs == 4 and report.examples == 2 and report.triplets == 2 and report.rejected == 0
    t = next(t for t in trips if t.origin == "糖尿病")
    assert t.anchor == "糖尿病饮食要注意什么？" and t.positive == "消渴饮食要注意什么呢？"
    assert t.hard_negative == "消渴会遗传吗？" and t.easy_negative == "糖尿病的病因是什么？"
    again = build_sts_triplets(SYN, SENTS, fake_generator, per_pair=1, show_progress=False)
    assert [x.to_dict() for x in again] == [x.to_dict() for x in trips]  # seeded sentence choice
    assert len(build_sts_triplets(SYN, SENTS, fake_generator, per_pair=5, show_progress=False)) == 3


def test_outputs_missing_the_terms_are_rejected_and_paper_keys_accepted():
    def sloppy(ex):
        return {"positive": "完全不相关", "negative-1": f"{ex.replace}?", "negative-2": f"{ex.origin}?"}

    report = StsReport()
    assert build_sts_triplets(SYN, SENTS, sloppy, show_progress=False, report=report) == []
    assert report.rejected == 2
    assert len(build_sts_triplets(SYN, SENTS, sloppy, require_terms=False, show_progress=False)) == 2


def test_prompt_generator_and_pairs_roundtrip(tmp_path):
    seen = []

    def complete(prompt):
        seen.append(prompt)
        return json.dumps({"positive": "血压高患者能吃党参吗？", "negative-1": "血压高会头痛吗？",
                           "negative-2": "高血压如何测量？"}, ensure_ascii=False)

    trips = build_sts_triplets({"高血压": ["血压高"]}, SENTS[:1], PromptGenerator(complete), symmetric=False,
                               show_progress=False)
    assert len(trips) == 1 and '"replace": "血压高"' in seen[0]
    rows = to_sts_pairs(trips)
    assert [r["score"] for r in rows] == [1.0, 0.0, 0.0]
    path = tmp_path / "sts.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8")
    assert len(load_sts(path)) == 3


def test_synonym_files(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(SYN, ensure_ascii=False), encoding="utf-8")
    assert load_synonyms(tmp_path / "s.json") == SYN
    (tmp_path / "s.tsv").write_text("# comment\n高血压\t血压高\t高血压病\n", encoding="utf-8")
    assert load_synonyms(tmp_path / "s.tsv") == {"高血压": ["血压高", "高血压病"]}
    (tmp_path / "bad.tsv").write_text("高血压\n", encoding="utf-8")
    with pytest.raises(DataError, match="bad.tsv:1"):
        load_synonyms(tmp_path / "bad.tsv")
    assert ("血压高", "高血压") in synonym_pairs(SYN) and ("血压高", "高血压") not in synonym_pairs(SYN, False)
