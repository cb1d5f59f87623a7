"""BMRetriever (Xu et al., 2024): decoder-LLM biomedical retrievers trained in two stages.

:func:`build_retriever` (EOS-pooling decoder tower or any ST model, dot product, instructions as prompts),
stage I pairs (:mod:`~medadapt.bmretriever.pretrain_data`), stage II data (:mod:`~medadapt.bmretriever.finetune_data`,
:mod:`~medadapt.bmretriever.synthetic`), training as stages of the one loop (:func:`contrastive_stage`,
:func:`train_stage`), and the ``kind: bmretriever`` recipe (:class:`BmRetrieverRecipe`). See docs/bmretriever.md.
"""

from __future__ import annotations

from medadapt.bmretriever.finetune_data import beir_groups, groups_to_dataset, subsample_groups
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
)
from medadapt.bmretriever.recipe import stage1_dataset, stage2_datasets
from medadapt.bmretriever.schema import BmRetrieverRecipe, BmStageSection
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
