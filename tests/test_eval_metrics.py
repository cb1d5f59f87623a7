"""Med-MoE-Embed's paper-compatible metrics (``paper_f1@k``, ``paper_map@k``, ``paper_accuracy@k``) next to
trec_eval's: hand-computed values on a toy run, trec_eval's tie order, and the derivation from the paper's
published rows (its Tables I, II, V, VI and III, transcribed below)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from medadapt.eval.metrics import (
    PAPER_METRICS,
    PER_QUERY_METRICS,
    evaluate_run,
    f1_of_means,
    parse_metric,
)

# ----------------------------------------------------------------------------------------------- by hand

#: q1: three relevant (a, b, c), two judged non-relevant (n1, n2); its top 4 are a, n1, x (unjudged), b.
#: q2: one relevant, one judged non-relevant; nothing judged is retrieved. q3: one relevant, found first.
QRELS = {"q1": {"a": 2, "b": 1, "c": 1, "n1": 0, "n2": 0}, "q2": {"d": 1, "n3": 0}, "q3": {"m": 1}}
RUN = {"q1": {"a": 0.9, "n1": 0.8, "x": 0.7, "b": 0.6, "c": 0.1},
       "q2": {"e": 0.9, "f": 0.8, "g": 0.7, "h": 0.6},
       "q3": {"m": 0.9, "z": 0.1}}


def test_paper_metrics_by_hand():
    m = evaluate_run(QRELS, RUN, ["precision@4", "recall@4", "f1@4", "paper_f1@4", "map@4", "paper_map@4",
                                  "accuracy@4", "paper_accuracy@4"])
    f = Fraction
    p = (f(2, 4) + 0 + f(1, 4)) / 3                      # 1/4
    r = (f(2, 3) + 0 + 1) / 3                            # 5/9
    assert m["precision@4"] == pytest.approx(float(p)) and m["recall@4"] == pytest.approx(float(r))
    # trec: the mean of per-query F1 (q1 4/7, q2 0, q3 2/5); paper: F1 of the mean P and mean R
    assert m["f1@4"] == pytest.approx(float((f(4, 7) + 0 + f(2, 5)) / 3))
    assert m["paper_f1@4"] == pytest.approx(float(2 * p * r / (p + r)))  # 10/29 = 0.3448
    assert m["paper_f1@4"] == pytest.approx(10 / 29) and m["f1@4"] == pytest.approx(34 / 105)
    # AP over the top 4 of q1: precision at its relevant ranks 1 and 4 = 1 and 2/4; trec divides by the 3
    # relevant, the paper by the 2 retrieved. q2 retrieves none (no AP: left out), q3 has AP 1.
    assert m["map@4"] == pytest.approx(float((f(3, 2) / 3 + 0 + 1) / 3))   # 0.5
    assert m["paper_map@4"] == pytest.approx(float((f(3, 2) / 2 + 1) / 2))  # 0.875 > recall 0.556
    # judged documents classified by "in the top 4": q1 a, b right, n2 right (n1 retrieved: wrong, c missed:
    # wrong; x unjudged: not counted) = 3/5; q2 n3 right, d missed = 1/2; q3 1/1
    assert m["paper_accuracy@4"] == pytest.approx(float((f(3, 5) + f(1, 2) + 1) / 3))  # 0.7
    assert m["accuracy@4"] == pytest.approx(2 / 3)  # trec success: q1 and q3 have a hit


def test_paper_metrics_follow_trec_evals_order_on_ties_and_grade_rules():
    # equal scores: trec_eval ranks ties by document id descending, so "b" is the top 1, not "a"
    qrels, run = {"q": {"a": 1, "b": 0}}, {"q": {"a": 1.0, "b": 1.0}}
    m = evaluate_run(qrels, run, ["precision@1", "paper_accuracy@1", "paper_map@1", "paper_f1@1"])
    assert m == {"precision@1": 0.0, "paper_accuracy@1": 0.0, "paper_map@1": 0.0, "paper_f1@1": 0.0}
    # a negative grade (TREC junk) is a judged non-relevant document; a query the run misses scores 0
    qrels = {"q": {"a": 1, "junk": -2}, "missing": {"b": 1}}
    m = evaluate_run(qrels, {"q": {"a": 0.5, "junk": 0.1}}, ["paper_accuracy@1", "paper_map@1", "recall@1"])
    assert m["paper_accuracy@1"] == pytest.approx((1.0 + 0.0) / 2)  # q: both right; missing: b missed
    assert m["paper_map@1"] == 1.0 and m["recall@1"] == 0.5


def test_metric_names_keep_the_two_families_apart():
    assert set(PAPER_METRICS) == {"paper_f1", "paper_map", "paper_accuracy"}
    assert not set(PAPER_METRICS) & set(PER_QUERY_METRICS)
    assert parse_metric("paper_f1@10") == ("paper_f1", 10)
    with pytest.raises(ValueError, match=r"'paper_map@10' is computed over all queries at once.*map@10"):
        parse_metric("paper_map@10", per_query=True)
    with pytest.raises(ValueError, match="unknown metric 'paper_ndcg@10'"):
        parse_metric("paper_ndcg@10")


# ------------------------------------------------------------------------------------------ the paper's rows

#: Med-MoE-Embed (top K = 10 unless named), transcribed from the paper: (Recall, Precision, F1, mAP, Accuracy)
ROWS = {
    ("Table I", "MPD-Title", "E5-base-v2"): (0.212, 0.526, 0.302, 0.541, 0.545),
    ("Table I", "MPD-Title", "E5-GELU"): (0.340, 0.835, 0.483, 0.890, 0.651),
    ("Table I", "MPD-Title", "E5-SWIGLU"): (0.295, 0.704, 0.416, 0.763, 0.611),
    ("Table I", "MPD-Title", "E5-MME-Title"): (0.346, 0.915, 0.502, 0.917, 0.680),
    ("Table I", "MPD-Title", "GTE-en-base"): (0.210, 0.514, 0.298, 0.566, 0.542),
    ("Table I", "MPD-Title", "GTE-en-GELU"): (0.315, 0.828, 0.456, 0.840, 0.645),
    ("Table I", "MPD-Title", "GTE-en-SWIGLU"): (0.330, 0.866, 0.478, 0.899, 0.662),
    ("Table I", "MPD-Title", "GTE-MME-Title"): (0.363, 0.978, 0.529, 0.984, 0.703),
    ("Table I", "MPD-RP", "E5-base-v2"): (0.229, 0.562, 0.325, 0.600, 0.566),
    ("Table I", "MPD-RP", "E5-GELU"): (0.336, 0.829, 0.478, 0.877, 0.647),
    ("Table I", "MPD-RP", "E5-SWIGLU"): (0.328, 0.823, 0.469, 0.864, 0.664),
    ("Table I", "MPD-RP", "E5-MME-RP"): (0.352, 0.869, 0.501, 0.902, 0.676),
    ("Table I", "MPD-RP", "GTE-en-base"): (0.227, 0.555, 0.322, 0.581, 0.565),
    ("Table I", "MPD-RP", "GTE-en-GELU"): (0.319, 0.785, 0.454, 0.787, 0.653),
    ("Table I", "MPD-RP", "GTE-en-SWIGLU"): (0.338, 0.830, 0.480, 0.828, 0.667),
    ("Table I", "MPD-RP", "GTE-MME-RP"): (0.367, 0.922, 0.525, 0.921, 0.686),
    ("Table II", "MMD", "M3E"): (0.379, 0.592, 0.462, 0.551, 0.568),
    ("Table II", "MMD", "M3E-FPFT"): (0.372, 0.254, 0.302, 0.318, 0.231),
    ("Table II", "MMD", "M3E-GELU"): (0.531, 0.514, 0.522, 0.569, 0.617),
    ("Table II", "MMD", "M3E-SWIGLU"): (0.575, 0.493, 0.531, 0.493, 0.612),
    ("Table II", "MMD", "M3E-MME"): (0.477, 0.640, 0.547, 0.645, 0.638),
    ("Table II", "MMD", "GTE-zh-base"): (0.398, 0.644, 0.492, 0.582, 0.614),
    ("Table II", "MMD", "GTE-zh-GELU"): (0.423, 0.648, 0.512, 0.588, 0.617),
    ("Table II", "MMD", "GTE-zh-SWIGLU"): (0.467, 0.647, 0.542, 0.592, 0.615),
    ("Table II", "MMD", "GTE-zh-MME"): (0.502, 0.668, 0.573, 0.653, 0.628),
    # Table III prints percent with two decimals
    ("Table III", "MCQA-Retri", "E5-base"): (0.9198, 0.5033, 0.6506, 0.8824, 0.8443),
    ("Table III", "MCQA-Retri", "E5-MME"): (0.9210, 0.5966, 0.7241, 0.9095, 0.8458),
    ("Table III", "MCQA-Retri", "GTE-base"): (0.9103, 0.6058, 0.7275, 0.9031, 0.8445),
    ("Table III", "MCQA-Retri", "GTE-MME"): (0.9354, 0.6669, 0.7787, 0.9110, 0.8653),
    ("Table III", "MCQA-Retri", "PubMedBert"): (0.9266, 0.6306, 0.7505, 0.9512, 0.8647),
    ("Table III", "MCQA-Retri", "PubMedBert-MME"): (0.9530, 0.7856, 0.8612, 0.9735, 0.9191),
    ("Table V", "MPD", "E5-MME(Title)"): (0.315, 0.830, 0.457, 0.850, 0.641),
    ("Table V", "MPD", "E5-MME(RP)"): (0.336, 0.836, 0.479, 0.840, 0.660),
    ("Table V", "MPD", "GTE-MME-RP"): (0.359, 0.905, 0.514, 0.917, 0.686),
    ("Table V", "MPD", "GTE-MME(Title)"): (0.343, 0.936, 0.502, 0.950, 0.678),
    ("Table V", "MPD", "GTE-MME(RP)"): (0.354, 0.905, 0.509, 0.889, 0.683),
    ("Table VI", "MPD-RP", "top-15"): (0.494, 0.915, 0.642, 0.917, 0.729),
    ("Table VI", "MPD-RP", "top-20"): (0.601, 0.877, 0.713, 0.912, 0.772),
    ("Table VI", "MPD-RP", "top-30"): (0.755, 0.706, 0.730, 0.897, 0.701),
}


@pytest.mark.parametrize("row", list(ROWS), ids=" / ".join)
def test_f1_is_the_harmonic_mean_of_the_published_precision_and_recall(row):
    """F1 = 2PR/(P+R) of the row's own (averaged) P and R, to the printed precision, in every row."""
    recall, precision, f1, _, _ = ROWS[row]
    half_unit = 0.00005 if row[0] == "Table III" else 0.0005
    assert f1_of_means(precision, recall) == pytest.approx(f1, abs=half_unit + 1e-9)


def test_which_published_relationships_trec_definitions_cannot_produce():
    """The rows the trec definitions rule out: mAP > Recall (trec map@k <= recall@k query by query) and
    Accuracy < Precision (success@k >= precision@k query by query)."""
    map_above_recall = [r for r, (rec, _, _, m, _) in ROWS.items() if m > rec]
    acc_below_precision = [r for r, (_, p, _, _, a) in ROWS.items() if a < p]
    assert len(map_above_recall) == 33 and len(acc_below_precision) == 27
    # Table III: one positive per question (§IV-A) caps trec precision@10 at 0.1, yet its precision is
    # 0.50-0.79: it is not relevant-in-top-10 / 10 (no definition here reproduces Table III's precision)
    assert all(p > 0.1 for (t, _, _), (_, p, _, _, _) in ROWS.items() if t == "Table III")


def _synthetic_run(recall: float, precision: float, k: int, pool: float, n_queries: int = 100):
    """Qrels and a run with the row's mean precision@k (exactly) and mean recall@k (to 0.0005): query i has
    ``hits[i]`` relevant documents in its top k (first), ``k - hits[i]`` judged non-relevant ones after them,
    ``rels[i]`` relevant documents in all and about ``(pool - 1) * rels[i]`` judged non-relevant ones."""
    total = round(precision * k * n_queries)
    hits = [total // n_queries + (i < total % n_queries) for i in range(n_queries)]
    rels, so_far = [], 0.0
    for i, h in enumerate(hits):  # each query's relevant count keeps the running mean recall at R
        options = {max(h, 1, int(h / recall)), max(h, 1, int(h / recall) + 1)}
        best = min(options, key=lambda n: abs(so_far + h / n - recall * (i + 1)))
        rels.append(best)
        so_far += h / best
    qrels, run = {}, {}
    for i, (h, n_rel) in enumerate(zip(hits, rels)):
        n_non = max(int((pool - 1) * n_rel + (i + 0.5) / n_queries), k - h)  # dithered: fine steps
        qrels[f"q{i}"] = {**{f"r{j}": 1 for j in range(n_rel)}, **{f"n{j}": 0 for j in range(n_non)}}
        top = [f"r{j}" for j in range(h)] + [f"n{j}" for j in range(k - h)]
        run[f"q{i}"] = {d: float(k - rank) for rank, d in enumerate(top)}
    return qrels, run


def _pool_for_accuracy(recall, precision, k, accuracy):
    """The judged-pool size (as a multiple of the relevant documents) whose paper_accuracy@k is the row's."""
    def acc(pool):
        qrels, run = _synthetic_run(recall, precision, k, pool)
        return evaluate_run(qrels, run, [f"paper_accuracy@{k}"])[f"paper_accuracy@{k}"]

    lo, hi = 1.5, 3.0  # accuracy grows with the pool: (hits + judged non-relevant left out) / judged
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if acc(mid) < accuracy else (lo, mid)
    return (lo + hi) / 2


SHOWN = [("Table I", "MPD-Title", "E5-MME-Title"), ("Table I", "MPD-RP", "GTE-MME-RP"),
         ("Table II", "MMD", "GTE-zh-MME"), ("Table VI", "MPD-RP", "top-20")]


@pytest.mark.parametrize("row", SHOWN, ids=" / ".join)
def test_paper_metrics_reproduce_the_published_relationships(row):
    """A run with the row's P and R: paper_f1 gives the printed F1; paper_map exceeds recall and
    paper_accuracy falls below precision as printed (trec's map@k and success@k cannot); a judged pool of
    about twice the relevant documents per query (the paper does not give its pool) gives the printed
    accuracy."""
    recall, precision, f1, map_, accuracy = ROWS[row]
    k = int(row[2].split("-")[1]) if row[0] == "Table VI" else 10
    pool = _pool_for_accuracy(recall, precision, k, accuracy)
    qrels, run = _synthetic_run(recall, precision, k, pool)
    names = [f"{m}@{k}" for m in ("precision", "recall", "paper_f1", "paper_map", "map", "paper_accuracy",
                                  "accuracy")]
    m = {name.split("@")[0]: v for name, v in evaluate_run(qrels, run, names).items()}
    assert m["precision"] == pytest.approx(precision, abs=1e-9)
    assert m["recall"] == pytest.approx(recall, abs=5e-4)
    assert m["paper_f1"] == pytest.approx(f1_of_means(m["precision"], m["recall"]), abs=1e-12)
    assert m["paper_f1"] == pytest.approx(f1, abs=1e-3)
    assert map_ > recall and m["paper_map"] > m["recall"] >= m["map"]
    assert accuracy < precision and m["paper_accuracy"] < m["precision"] <= m["accuracy"]
    assert m["paper_accuracy"] == pytest.approx(accuracy, abs=2e-3) and 1.9 <= pool <= 2.3


def test_paired_comparison_refuses_the_paper_metrics(tmp_path):
    """``--compare`` pairs per-query values: the paper metrics have none, so they are refused by name."""
    from typer.testing import CliRunner

    from medadapt.cli import app
    from medadapt.eval.compare import per_query_scores

    with pytest.raises(ValueError, match=r"'paper_f1@10' is computed over all queries at once.*f1@10"):
        per_query_scores(QRELS, RUN, "paper_f1@10")
    assert per_query_scores(QRELS, RUN, "f1@4")["q3"] == pytest.approx(0.4)
    result = CliRunner().invoke(app, ["eval", "--compare", "a.json", "b.json", "--data", str(tmp_path),
                                      "--metrics", "paper_accuracy@10"])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("error: metric 'paper_accuracy@10' is computed over all queries at once")
