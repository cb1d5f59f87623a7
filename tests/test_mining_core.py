"""One core for mining, exact search, language detection and the hybrid score: the system-specific entry
points are thin wrappers whose results equal the code they replaced."""

from __future__ import annotations

import numpy as np
import pytest

from medadapt.curation import MiningConfig, mine_from_embeddings


def _embeddings(n_q=40, n_docs=300, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    d = rng.normal(size=(n_docs, dim)).astype(np.float32)
    q = d[:n_q] + 0.5 * rng.normal(size=(n_q, dim)).astype(np.float32)
    return q, d


def _care_reference(q, d, count, skip_top, depth, exclude):
    """CARE's stage-II mining as ``asym.data.mine_hard_negatives`` did it before it used the shared miner."""
    from medadapt.retrieval.exact import exact_search, normalize_rows

    _, idx = exact_search(normalize_rows(q), normalize_rows(d), depth + skip_top + count)
    out = []
    for i in range(len(q)):
        ranked = [int(j) for j in idx[i] if j >= 0 and int(j) not in exclude[i]][skip_top:]
        out.append(ranked[:count])
    return out


def test_count_positives_false_ranks_among_non_relevant_documents():
    q, d = _embeddings()
    from medadapt.retrieval.exact import exact_search, normalize_rows

    _, idx = exact_search(normalize_rows(q), normalize_rows(d), 30)
    # make the 2nd and 4th best documents of each query its positives
    positives = [{int(idx[i, 1]), int(idx[i, 3])} for i in range(len(q))]
    cfg = MiningConfig(window=(2, 4), num_negatives=3, embedding_dup_threshold=None)
    got = mine_from_embeddings(q, d, positives, cfg, count_positives=False, pick="best")
    for i in range(len(q)):
        non_rel = [int(j) for j in idx[i] if int(j) not in positives[i]]
        assert got[i] == non_rel[1:4]  # ranks 2..4 among non-relevant documents
    # counted with positives, ranks 2..4 hold two positives: only one negative is left
    counted = mine_from_embeddings(q, d, positives, cfg, pick="best")
    assert all(n == [int(idx[i, 2])] for i, n in enumerate(counted))


def test_care_mining_is_the_shared_miner_with_unchanged_results():
    pytest.importorskip("medadapt.care.data")
    from medadapt.care.data import TrainPair, mine_hard_negatives

    q, d = _embeddings()
    rng = np.random.default_rng(3)
    exclude = [{i} | {int(x) for x in rng.choice(len(d), size=3, replace=False)} for i in range(len(q))]
    for count, skip_top in [(1, 0), (3, 3), (5, 10)]:
        pairs = [TrainPair(f"q{i}", i) for i in range(len(q))]
        mine_hard_negatives(pairs, q, d, count, skip_top=skip_top, depth=50, exclude=exclude)
        assert [p.negatives for p in pairs] == _care_reference(q, d, count, skip_top, 50, exclude)
        assert all(not set(p.negatives) & exclude[i] for i, p in enumerate(pairs))
    # a corpus too small for the window still gives `count` negatives (padded), never a positive
    pairs = [TrainPair("q", 0)]
    mine_hard_negatives(pairs, q[:1], d[:4], 3, skip_top=5, exclude=[{0, 1}])
    assert pairs[0].negatives == [2, 3, 2]


def test_one_exact_search_and_one_language_detector():
    import medadapt.eval as ev
    import medadapt.eval.search as es
    import medadapt.retrieval.exact as ex
    from medadapt.hyrec.model import cjk_characters
    from medadapt.retrieval import tokenize

    assert es.exact_search is ex.exact_search is ev.exact_search
    assert es.normalize_rows is ex.normalize_rows and es.prepare_for_similarity is ex.prepare_for_similarity
    assert cjk_characters is tokenize.cjk_characters
    assert tokenize.detect_language(["高血压患者能吃党参吗？"]) == "zh"
    assert tokenize.detect_language(["what causes gout?", "高"]) == "en"  # 1 CJK character of 18
    assert tokenize.cjk_characters(["豈 a 高血压 高"]) == ["压", "血", "豈", "高"]  # compatibility block too
    with pytest.raises(ValueError, match="cosine"):
        ex.prepare_for_similarity(np.ones((1, 2)), "euclidean")


def test_one_hybrid_score():
    from medadapt.hyrec.normalize import hybrid_score as hyrec_score
    from medadapt.retrieval.fusion import hybrid_score, hybrid_topk, hybrid_weights

    assert hyrec_score is hybrid_score
    assert hybrid_score(0.5, 0.25) == 0.75 and hybrid_score(0.5, 0.25, dense_weight=2.0) == 1.0
    positions, scores = hybrid_topk(np.array([7, 3, 5]), np.array([0.25, 0.0, 0.5]), np.array([0.25, 0.75, 0.25]),
                                    dense_weight=1.0, k=2)
    assert positions.tolist() == [3, 5] and scores.tolist() == [0.75, 0.75]  # a tie goes to the lower position
    assert hybrid_weights(0.25) == [0.25, 1.0]
    with pytest.raises(ValueError, match="dense_weight"):
        hybrid_weights(-1.0)
