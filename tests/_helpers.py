"""Helpers shared by several test files (not a test module: pytest collects nothing here).

Test files import from here, never from each other; fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize
from torch import nn

from medadapt.care import build_asymmetric_model, decoder_tower_modules
from medadapt.losses import InfoNCELoss
from medadapt.retrieval import Documents
from medadapt.tiny import TOPICS, build_tiny_bert
from medadapt.training.loop import Stage, train

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
PACKAGE = ROOT / "medadapt"
SYSTEMS = ("medadapt.moe", "medadapt.care", "medadapt.care", "medadapt.hyrec", "medadapt.bmretriever")


# ---------------------------------------------------------------------------------------- models
def doc_tower(path, padding_side: str = "left") -> SentenceTransformer:
    """A fresh decoder document tower (EOS pooling, Normalize) on the saved decoder at ``path``."""
    return SentenceTransformer(modules=[*decoder_tower_modules(str(path), padding_side=padding_side), Normalize()],
                               device="cpu")


def asymmetric_base(bert: Path) -> Path:
    """A saved asymmetric (Router) model of two tiny BERT towers beside ``bert``, built once: the base of a
    head on the query route."""
    folder = bert.parent / "asymmetric"
    if not (folder / "modules.json").is_file():
        query = SentenceTransformer(str(build_tiny_bert(bert.parent / "query-tower", seed=5)), device="cpu")
        build_asymmetric_model(query, SentenceTransformer(str(bert), device="cpu"), device="cpu").save(str(folder))
    return folder


def tiny_system_recipe(kind: str, bert: Path, qwen: Path, beir: Path) -> tuple[Path, list[str]]:
    """The shipped tiny recipe of system ``kind`` and the ``--set`` overrides that run it in seconds on the tiny
    BERT ``bert``, the tiny Qwen2 ``qwen`` and the BEIR folder ``beir``. Kinds: ``moe``, ``moe-hybrid`` (MoE
    head + HyReC lexical branch), ``moe-care-query`` (MoE head on the query route of an asymmetric model),
    ``moe-lora`` / ``moe-backbone`` (Med-MoE-Embed's LoRA / full backbone path), ``hyrec``, ``care``,
    ``bmretriever``."""
    if kind == "moe-hybrid":
        return RECIPES / "med-moe-embed-hybrid-tiny.yaml", [
            f"model.backbone={bert}", f"data.path={beir}", "data.hard_negatives.window=[2, 6]",
            "training.batch_size=4", "branches.0.negatives.window=[2, 6]", "branches.0.training.batch_size=4",
            "eval.split=test"]
    if kind == "moe-care-query":
        recipe, overrides = tiny_system_recipe("moe", bert, qwen, beir)
        return recipe, [*overrides, f"model.backbone={asymmetric_base(bert)}", "head.route=query"]
    if kind in ("moe-lora", "moe-backbone"):  # the backbone / LoRA path: one stage of the loop on the texts
        recipe, overrides = tiny_system_recipe("moe", bert, qwen, beir)
        trains = (["model.peft={kind: lora, r: 4, alpha: 8, dropout: 0.0, target_modules: [query, value]}"]
                  if kind == "moe-lora" else ["model.freeze_backbone=false", "head={kind: none}"])
        return recipe, [*overrides, *trains, "training.shared_epochs=0", "training.random_routing_epochs=0",
                        "loss.load_balance_weight=0"]
    if kind == "moe":
        return RECIPES / "med-moe-embed-tiny.yaml", [
            f"model.backbone={bert}", f"data.path={beir}", "data.hard_negatives.window=[2, 6]",
            "training.batch_size=4", "training.shared_epochs=1", "training.random_routing_epochs=1",
            "training.epochs=2", "eval.split=test"]
    if kind == "hyrec":
        return RECIPES / "hyrec-tiny.yaml", [f"model.backbone={bert}", f"data.path={beir}", "training.epochs=2"]
    if kind == "care":
        return RECIPES / "care-tiny.yaml", [f"document.model={qwen}", f"query.model={bert}", f"data.path={beir}"]
    if kind == "bmretriever":
        return RECIPES / "bmretriever-tiny.yaml", bmretriever_overrides(qwen, beir, bert)
    raise ValueError(f"unknown system kind {kind!r}")


def bmretriever_overrides(decoder: Path, beir: Path, bert: Path) -> list[str]:
    """``recipes/bmretriever-tiny.yaml`` on the tiny decoder ``decoder``, BEIR folder ``beir`` and the tiny BERT
    ``bert`` mining stage II's negatives."""
    return [f"model.name={decoder}", f"data.path={beir}", f"stage2.base_retriever={bert}"]


# ---------------------------------------------------------------------------------- training loop
class PairStep:
    """InfoNCE between a linear map of queries and of documents (in-batch negatives only)."""

    def __init__(self, q, d, dropout: float = 0.0):
        self.q, self.d = q, d
        self.loss_fn = InfoNCELoss(0.1)
        self.dropout = dropout

    def forward(self, model, batch):
        q = nn.functional.dropout(model(self.q[batch.indices]), self.dropout, training=True)
        return {"q": q, "d": model(self.d[batch.indices])}

    def loss(self, out, batch):
        return self.loss_fn(out["q"], out["d"])


class StopRun(Exception):
    """Raised to kill a run part-way (resume tests)."""


def pair_data(n: int = 32, d: int = 8, seed: int = 0):
    """``n`` random queries and their noisy document twins (``d`` dimensions)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, d, generator=g)
    return q, q + 0.3 * torch.randn(n, d, generator=g)


def linear_model(d: int = 8) -> nn.Linear:
    torch.manual_seed(1)
    return nn.Linear(d, d)


def loop_run(optim, *, dropout: float = 0.0, **kwargs):
    """One stage of :class:`PairStep` on :func:`pair_data` through the one loop; ``(model, result)``."""
    q, d = pair_data()
    model = linear_model()
    res = train(model, [Stage("main", len(q), PairStep(q, d, dropout), list(model.parameters()), optim)],
                seed=3, **kwargs)
    return model, res


# -------------------------------------------------------------------------------------- retrieval
def tiny_docs() -> Documents:
    """Two documents per topic of :data:`medadapt.tiny.TOPICS` (a definition with a title, a symptom line)."""
    ids, titles, texts = [], [], []
    for i, (name, words) in enumerate(TOPICS):
        ids += [f"d{i}", f"s{i}"]
        titles += [name, ""]
        texts += [f"{name} is a condition with {words}.", f"symptoms of {name}: {words.split()[0]} and more"]
    return Documents(ids, texts, titles)


class ToyEncoder:
    """A dense + sparse encoder written against the protocols only: bag of words over a tiny vocabulary."""

    encoder_tag = "toy"
    similarity_fn_name = "dot"
    vocab = ("gout", "toe", "asthma", "wheezing", "sugar", "insulin")

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    @property
    def n_terms(self) -> int:
        return len(self.vocab)

    def encoder_identity(self):
        return {"fingerprint": f"toy-{self.scale}", "similarity": "dot"}

    def _dense(self, texts):
        return np.array([[self.scale * t.count(w) for w in self.vocab] for t in texts], dtype=np.float32)

    def encode_query(self, texts, *, batch_size=64):
        return self._dense(texts)

    def encode_document(self, texts, *, batch_size=64, show_progress=False):
        return self._dense(texts)

    def encode_lexical(self, texts, role="document", *, batch_size=32, show_progress=False):
        return [{i: 1.0 for i, w in enumerate(self.vocab) if w in t} for t in texts]


TOY_DOCS = Documents(["a", "b", "c"], ["gout hurts the big toe", "asthma causes wheezing", "insulin lowers sugar"])


# ---------------------------------------------------------------------------------------- imports
def medadapt_imports(path: Path) -> set[str]:
    """The medadapt modules (and ``module.name`` pairs) a library file imports anywhere in it, relative
    imports resolved."""
    package = ".".join(path.relative_to(ROOT).parts[:-1])  # the package a relative import starts from
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("medadapt")}
