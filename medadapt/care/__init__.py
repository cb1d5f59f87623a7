"""Asymmetric retrieval (CARE): a small query tower aligned to a large (LLM) document tower, on
sentence-transformers' ``Router``; see ``docs/care.md``. Modules: towers (:mod:`~medadapt.decoder`, ``pruning``,
``static``, ``truncate``, ``lora``), the model (``model``), training items (``data``), the loss
(``alignment_loss``), the phases' Steps and Stages (``stages``), the recipe (``sections``, ``train``, ``plan``,
``evaluate``) and its registration (``system``).
"""

from __future__ import annotations

from medadapt.care.alignment_loss import NormalizedMSELoss, QueryAlignmentLoss
from medadapt.care.data import (TrainPair, labelled_pairs, mine_hard_negatives, mined_pairs,
                                self_contrastive_texts)
from medadapt.care.evaluate import evaluate_asymmetric, query_speed
from medadapt.care.lora import attach_document_lora, has_lora, merge_document_lora
from medadapt.care.model import build_asymmetric_model, is_asymmetric, route_modules, tower
from medadapt.care.pruning import prune_layers
from medadapt.care.sections import CareRecipe
from medadapt.care.stages import (AlignReplay, CarePhaseSection, align_queries, align_stage, embed,
                                  init_stage, init_tower, joint_finetune, joint_stage, teacher_targets,
                                  trainable_only)
from medadapt.care.static import static_from_document
from medadapt.care.truncate import MatryoshkaTruncate
from medadapt.decoder import EosTransformer, append_eos, decoder_tower_modules

__all__ = [
    "AlignReplay",
    "CarePhaseSection",
    "CareRecipe",
    "EosTransformer",
    "MatryoshkaTruncate",
    "NormalizedMSELoss",
    "QueryAlignmentLoss",
    "TrainPair",
    "align_queries",
    "align_stage",
    "append_eos",
    "attach_document_lora",
    "build_asymmetric_model",
    "decoder_tower_modules",
    "embed",
    "evaluate_asymmetric",
    "has_lora",
    "init_stage",
    "init_tower",
    "is_asymmetric",
    "joint_finetune",
    "joint_stage",
    "labelled_pairs",
    "merge_document_lora",
    "mine_hard_negatives",
    "mined_pairs",
    "prune_layers",
    "query_speed",
    "route_modules",
    "self_contrastive_texts",
    "static_from_document",
    "teacher_targets",
    "tower",
    "trainable_only",
]
