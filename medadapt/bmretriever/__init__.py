"""BMRetriever (Xu et al., 2024): decoder-LLM biomedical retrievers trained in two stages (docs/bmretriever.md).

Layout: :mod:`~.sections` (the ``kind: bmretriever`` recipe), :mod:`~.model` (the encoder), stage I and II data
(:mod:`~.pretrain_data`, :mod:`~.finetune_data`, :mod:`~.synthetic`), :mod:`~.train` (the stages as
``Stage``\\ s of the one loop), :mod:`~.plan`, registered by :mod:`~.system`.
"""

from __future__ import annotations

from medadapt.bmretriever.finetune_data import (
    beir_groups,
    groups_to_dataset,
    stage2_datasets,
    subsample_groups,
)
from medadapt.bmretriever.instructions import (
    EVAL_INSTRUCTIONS,
    FINETUNE_INSTRUCTIONS,
    PASSAGE_PROMPT,
    PRETRAIN_QUERY_PROMPT,
    QUERY_TEMPLATE,
    SYNTHETIC_INSTRUCTIONS,
    query_prompt,
)
from medadapt.bmretriever.model import build_retriever
from medadapt.bmretriever.pretrain_data import (
    CorpusSource,
    CropConfig,
    crop_pair,
    iter_corpus,
    iter_pretrain_pairs,
    pretrain_dataset,
    stage1_dataset,
)
from medadapt.bmretriever.sections import BmRetrieverRecipe, BmStageSection
from medadapt.bmretriever.synthetic import (
    TASK_ATTRIBUTES,
    FakeQueryGenerator,
    FakeTaskGenerator,
    QueryGenerator,
    SyntheticReport,
    TaskExample,
    TaskGenerator,
    TransformersQueryGenerator,
    generate_instance_data,
    generate_task_data,
    synthesize_query_groups,
    synthesize_task_groups,
)
from medadapt.bmretriever.train import contrastive_stage, train_stage

__all__ = [
    "EVAL_INSTRUCTIONS", "FINETUNE_INSTRUCTIONS", "PASSAGE_PROMPT", "PRETRAIN_QUERY_PROMPT", "QUERY_TEMPLATE",
    "SYNTHETIC_INSTRUCTIONS", "TASK_ATTRIBUTES", "BmRetrieverRecipe", "BmStageSection", "CorpusSource",
    "CropConfig", "FakeQueryGenerator", "FakeTaskGenerator", "QueryGenerator", "SyntheticReport",
    "TaskExample", "TaskGenerator", "TransformersQueryGenerator", "beir_groups", "build_retriever",
    "contrastive_stage", "crop_pair",
    "generate_instance_data", "generate_task_data", "groups_to_dataset",
    "iter_corpus", "iter_pretrain_pairs", "pretrain_dataset", "query_prompt", "stage1_dataset", "stage2_datasets",
    "subsample_groups", "synthesize_query_groups", "synthesize_task_groups", "train_stage",
]
