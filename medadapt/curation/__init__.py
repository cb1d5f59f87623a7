"""Training-data curation for medical retrieval (docs/curation.md): hard-negative mining with false-negative
guards, searchers, consistency filtering (BMRetriever §3.3), diversity-aware dedup (CARE §4.1), multi-judge
consensus labels and synonym STS triplets (CMedTEB §3.1), and an OpenAI-compatible completion backend.
"""

from medadapt.curation.bm25 import BM25Searcher
from medadapt.curation.consensus import ConsensusResult, LabeledPair, decide, label_pairs
from medadapt.curation.consistency import consistency_mask, filter_consistent_groups
from medadapt.curation.dedup import DedupConfig, DedupResult, dedup_texts, diversity_dedup
from medadapt.curation.dense import DenseSearcher
from medadapt.curation.fast_mining import mine_from_embeddings
from medadapt.curation.judges import Judge, JudgeError, PromptJudge, parse_grades
from medadapt.curation.kappa import category_counts, fleiss_kappa
from medadapt.curation.mining import MiningReport, mine_hard_negatives
from medadapt.curation.mining_config import MiningConfig, presets
from medadapt.curation.negatives import margin_threshold, sample_negatives
from medadapt.curation.openai_backend import BackendError, OpenAIChat
from medadapt.curation.rubrics import CMEDTEB_RUBRIC, CURE_RUBRIC, RUBRICS, Rubric, get_rubric
from medadapt.curation.search import Scorer, Searcher, batched_search
from medadapt.curation.sts_triplets import (
    PromptGenerator,
    StsReport,
    StsTriplet,
    SynonymExample,
    build_sts_triplets,
    load_synonyms,
    to_sts_pairs,
)
from medadapt.curation.textsim import is_near_duplicate, jaccard
from medadapt.curation.writers import write_jsonl, write_training_groups

__all__ = [
    "BM25Searcher", "BackendError", "CMEDTEB_RUBRIC", "CURE_RUBRIC", "ConsensusResult", "DedupConfig",
    "DedupResult", "DenseSearcher", "Judge", "JudgeError", "LabeledPair", "MiningConfig", "MiningReport",
    "OpenAIChat", "PromptGenerator", "PromptJudge", "RUBRICS", "Rubric", "Scorer", "Searcher",
    "StsReport", "StsTriplet", "SynonymExample", "batched_search", "build_sts_triplets", "category_counts",
    "consistency_mask", "decide", "dedup_texts", "diversity_dedup", "filter_consistent_groups",
    "fleiss_kappa", "get_rubric", "is_near_duplicate", "jaccard", "label_pairs", "load_synonyms",
    "margin_threshold", "mine_from_embeddings", "mine_hard_negatives", "parse_grades", "presets",
    "sample_negatives", "to_sts_pairs", "write_jsonl", "write_training_groups",
]
