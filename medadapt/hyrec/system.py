"""HyReC's one registration: ``kind: hyrec``, its plan and paper settings, the ``hyrec_lexical`` branch
with the bases it composes on, and its mining preset (entry point ``medadapt.systems: hyrec``)."""

from __future__ import annotations

from pathlib import Path

import medadapt.hyrec.branch as lexical
from medadapt.adapters.compose import HEAD, BranchKind
from medadapt.hyrec.evaluate import evaluate, evaluate_hyrec
from medadapt.hyrec.plan import plan_spec
from medadapt.hyrec.sections import HyReCRecipe
from medadapt.hyrec.train import train
from medadapt.systems import System, load_paper, register_system

__all__ = ["LEXICAL_BRANCH", "SYSTEM"]

_SPLITS = ("a head on one route of a one-tower model splits it into a Router, and the learned-lexical "
           "branch is composed on the one-tower model; put the head on route all, or start from an "
           "asymmetric model")

LEXICAL_BRANCH = BranchKind(
    "hyrec_lexical", lexical.HyReCLexicalBranch, lexical.build_and_train, lexical.evaluate, lexical.check,
    composes_on={
        "dense": ("HyReC learned-lexical branch beside the dense embedding (with or without a head on every "
                  "input): one hybrid model, one index"),
        "asymmetric": ("HyReC learned-lexical branch on the document tower: it reads the document tower's "
                       "token states for queries and documents alike (queries pay one pass through its first "
                       "layers), the dense side stays the two towers, so the document tower's cached "
                       "embeddings and any document index stay valid; needs a BERT-like encoder document "
                       "tower (checked on the model: decoder LLM towers are refused)"),
    },
    refused_with={("dense", (HEAD, "query")): _SPLITS, ("dense", (HEAD, "document")): _SPLITS})

def score_sparse(encoder, data, split: str, mode: str, metrics: list[str], settings) -> dict[str, float]:
    """How evaluation scores a HyReC encoder (``medadapt eval``, suites): HyReC's own evaluation, the lexical
    side through the inverted index, hybrid as the NM sum, with ``q_terms`` / ``d_terms``. A dense side saved
    with its own token limit is the plain sentence-transformers model, read through the cache."""
    dense_source = "cache" if encoder.config.dense_max_length and settings.reuse_cache else "model"
    want_run = settings.runs is not None
    out = evaluate_hyrec(encoder, data, split, mode, metrics, cache=settings.cache, dense_source=dense_source,
                         batch_size=settings.batch_size, show_progress=settings.show_progress, return_runs=want_run)
    if not want_run:
        return out
    scores, runs = out
    settings.runs.append(runs[mode])
    return scores


SYSTEM = register_system(System(
    "hyrec", HyReCRecipe, train, evaluate,
    summary="HyReC: learned lexical + dense retrieval from one model (GLAE, semantic union)",
    paper=load_paper(Path(__file__).with_name("paper.yaml")), plan=plan_spec, branches=(LEXICAL_BRANCH,), sparse_scorers={"hyrec": score_sparse},
    # Appendix B: ANN hard negatives ranked 20th-100th, 3 per query
    mining_presets={"hyrec": {"window": (20, 100), "num_negatives": 3}}))
