"""Multi-judge consensus labelling (CMedTEB §3.1) with deterministic fake judges, Fleiss' kappa checked
against hand computations, prompt judges and the OpenAI-compatible backend (no network)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from medadapt.curation import (
    CMEDTEB_RUBRIC,
    CURE_RUBRIC,
    JudgeError,
    OpenAIChat,
    PromptJudge,
    decide,
    fleiss_kappa,
    label_pairs,
    parse_grades,
)


class TableJudge:
    """Grades each passage from a fixed table (deterministic fake)."""

    def __init__(self, name, table):
        self.name, self.table = name, table

    def __call__(self, query, passages):
        return [self.table[p] for p in passages]


# labels (S/A positive): p1 [1,1,1]  p2 [1,1,0]  p3 [0,0,0]  p4 [0,0,1]
J1 = TableJudge("j1", {"p1": "S", "p2": "A", "p3": "D", "p4": "B"})
J2 = TableJudge("j2", {"p1": "A", "p2": "S", "p3": "C", "p4": "C"})
J3 = TableJudge("j3", {"p1": "S", "p2": "C", "p3": "D", "p4": "A"})
ITEMS = [("q1", ["p1", "p2"]), ("q2", ["p3", "p4"])]


def test_fleiss_kappa_hand_computed():
    # P_i = 1, 1/3, 1, 1/3 -> P̄ = 2/3; p = (.5, .5) -> P̄e = .5; kappa = (2/3 - 1/2) / (1/2) = 1/3
    assert fleiss_kappa([[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0]]) == pytest.approx(1 / 3)
    # Fleiss (1971) / Wikipedia worked example: 10 items, 14 raters, 5 categories -> 0.210
    table = np.array([[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
                      [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]])
    assert fleiss_kappa(table) == pytest.approx(0.20993, abs=1e-4)
    assert fleiss_kappa([["a", "a"], ["b", "b"]]) == pytest.approx(1.0)
    assert math.isnan(fleiss_kappa([["a", "a"], ["a", "a"]]))  # one category only: undefined
    with pytest.raises(ValueError, match="same number"):
        fleiss_kappa([["a", "b"], ["a"]])


def test_unanimous_keeps_full_agreement_and_drops_partial():
    res = label_pairs(ITEMS, [J1, J2, J3], CMEDTEB_RUBRIC, "unanimous", show_progress=False)
    kept = {p.passage: (p.label, p.grade) for p in res.kept}
    assert kept == {"p1": (1, "S"), "p3": (0, "D")}
    assert res.kappa_labels == pytest.approx(1 / 3)
    # grades: P̄ = (1/3 + 0 + 1/3 + 0)/4 = 1/6; p = (3,3,1,3,2)/12 -> P̄e = 2/9; kappa = -1/14
    assert res.kappa_grades == pytest.approx(-1 / 14)
    s = res.summary()
    assert (s["pairs"], s["kept"], s["dropped"], s["positives"], s["negatives"]) == (4, 2, 2, 1, 1)
    assert res.pairs[1].votes == {"j1": "A", "j2": "S", "j3": "C"} and res.pairs[1].agreement == 2
    groups = res.to_training_groups()
    assert [(g.query, g.pos, g.neg) for g in groups] == [("q1", ["p1"], [])]


def test_majority_policy_and_conservative_grade():
    res = label_pairs(ITEMS, [J1, J2, J3], CMEDTEB_RUBRIC, "majority", show_progress=False)
    kept = {p.passage: (p.label, p.grade) for p in res.kept}
    # p2: A and S agree on "positive" -> tie between grades goes to the lower level A; p4: B, C -> C
    assert kept == {"p1": (1, "S"), "p2": (1, "A"), "p3": (0, "D"), "p4": (0, "C")}
    on_grades = label_pairs(ITEMS, [J1, J2, J3], CMEDTEB_RUBRIC, "unanimous", "grade", show_progress=False)
    assert on_grades.kept == []
    maj_grades = label_pairs(ITEMS, [J1, J2, J3], CMEDTEB_RUBRIC, "majority", "grade", show_progress=False)
    assert {p.passage: p.grade for p in maj_grades.kept} == {"p1": "S", "p3": "D"}


def test_decide_ties_and_errors():
    assert decide(["S", "D"], CMEDTEB_RUBRIC, "majority") == (1, None, None)  # 1-1 tie is dropped
    assert decide(["2", "1", "0", "0"], CURE_RUBRIC, "majority") == (2, None, None)
    assert decide(["2", "2", "0"], CURE_RUBRIC, "majority") == (2, 1, "2")
    with pytest.raises(ValueError, match="valid policies: unanimous, majority"):
        decide(["S"], CMEDTEB_RUBRIC, "mean")


def test_bad_judges_raise():
    with pytest.raises(ValueError, match="at least 2"):
        label_pairs(ITEMS, [J1], show_progress=False)
    with pytest.raises(JudgeError, match="returned 1 grades for 2"):
        label_pairs(ITEMS, [J1, lambda q, ps: ["S"]], show_progress=False)
    with pytest.raises(JudgeError, match="grade 'E'"):
        label_pairs(ITEMS, [J1, lambda q, ps: ["E"] * len(ps)], show_progress=False)


def test_prompt_judge_cmedteb_batch_prompt():
    prompts = []

    def complete(prompt):
        prompts.append(prompt)
        return 'Sure.\n```json\n{"Passage-0": "a", "Passage-1": "D"}\n```'

    judge = PromptJudge(complete, CMEDTEB_RUBRIC, name="fake")
    assert judge("高血压能吃党参吗", ["党参降压", "感冒发烧"]) == ["A", "D"]
    assert len(prompts) == 1 and "- Query: 高血压能吃党参吗" in prompts[0] and "- Passage-1: 感冒发烧" in prompts[0]
    assert "2 passages" in prompts[0] and "S: The subject" in prompts[0]


def test_prompt_judge_cure_per_passage_and_retries():
    replies = iter(['no json here', '{"explanation": "x", "score": "2"}', '{"explanation": "y", "score": 0}'])
    judge = PromptJudge(lambda p: next(replies), CURE_RUBRIC, retries=1, clinical_role="nurse")
    assert judge("q", ["a", "b"]) == ["2", "0"]
    assert "You are a nurse" in CURE_RUBRIC.render("q", ["a"], clinical_role="nurse")[0]
    with pytest.raises(JudgeError, match="misses Passage-1"):
        parse_grades('{"Passage-0": "S"}', CMEDTEB_RUBRIC, 2)
    with pytest.raises(JudgeError, match="not one of"):
        parse_grades('{"score": "5"}', CURE_RUBRIC, 1)


def test_openai_backend_builds_requests_without_network():
    sent = []

    def post(url, payload, headers, timeout):
        sent.append((url, payload, headers))
        return {"choices": [{"message": {"content": json.dumps({"Passage-0": "S"})}}]}

    chat = OpenAIChat("gpt-4o", "http://localhost:9/v1/", api_key="k", post=post)
    judge = PromptJudge(chat, CMEDTEB_RUBRIC)
    assert judge("q", ["p"]) == ["S"] and judge.name == "gpt-4o"
    url, payload, headers = sent[0]
    assert url == "http://localhost:9/v1/chat/completions" and payload["model"] == "gpt-4o"
    assert payload["temperature"] == 0.0 and headers["Authorization"] == "Bearer k"
    from medadapt.curation import BackendError

    bad = OpenAIChat("m", api_key="", post=lambda *a: {"error": "x"})
    with pytest.raises(BackendError, match="unexpected reply"):
        bad("hi")
