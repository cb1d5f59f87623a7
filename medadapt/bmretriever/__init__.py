"""BMRetriever (Xu et al., 2024): decoder-LLM biomedical retrievers trained in two stages (issue #8).

* Encoder: :func:`build_retriever` (CARE's EOS-pooling decoder tower or any ST model, dot product,
  instructions as prompts); LoRA through :mod:`medadapt.training.lora` (PEFT, r=16, alpha=32).
* Stage I data (§3.2): :mod:`~medadapt.bmretriever.pretrain_data` (title -> abstract pairs, two disjoint
  random spans for untitled documents, streaming).
* Stage II data (§3.3): :mod:`~medadapt.bmretriever.finetune_data` (hard negatives from the curation tools),
  :mod:`~medadapt.bmretriever.synthetic` (pluggable query / task generators, Appendix A.1 prompts with sampled
  attributes, consistency filter, generate-N-keep-what-passes accounting).
* Training: :func:`contrastive_stage` / :func:`train_stage` (a Stage of the one loop: dot-product InfoNCE
  at temperature τ, in-batch (+ hard) negatives of the global batch, GradCache accumulation, one data set per
  batch), configured by the recipe's :class:`BmStageSection`.
* Recipes: :class:`BmRetrieverRecipe` (``kind: bmretriever``, registered by
  :mod:`medadapt.bmretriever.recipe`, run by :func:`medadapt.recipes.run_recipe`).
* Instruction tables (Appendix B): :mod:`~medadapt.bmretriever.instructions`.

Heavy libraries are imported inside functions.
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
