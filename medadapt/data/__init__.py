"""Data loading: BEIR retrieval folders, FlagEmbedding training groups, STS pairs, rerank lists; every loader
applies one text-input policy (:mod:`medadapt.data.text`)."""

from medadapt.data.beir import (BeirDataset, available_splits, check_split, domain_of, load_beir, load_corpus,
                                load_qrels, load_queries, merge_beir)
from medadapt.data.builtin import BUILTIN_DATASETS, builtin_names, data_folder, resolve_data_dir
from medadapt.data.jsonl import iter_jsonl
from medadapt.data.rerank import RerankItem, load_rerank
from medadapt.data.sts import StsPair, load_sts
from medadapt.data.text import check_text, decode_json
from medadapt.data.training import TrainingGroup, load_training_groups

__all__ = [
    "BeirDataset",
    "BUILTIN_DATASETS",
    "RerankItem",
    "StsPair",
    "TrainingGroup",
    "available_splits",
    "builtin_names",
    "check_split",
    "check_text",
    "data_folder",
    "decode_json",
    "domain_of",
    "iter_jsonl",
    "load_beir",
    "load_corpus",
    "load_qrels",
    "load_queries",
    "load_rerank",
    "load_sts",
    "load_training_groups",
    "merge_beir",
    "resolve_data_dir",
]
