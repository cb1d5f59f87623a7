"""Retrieval tasks: a BEIR folder (``queries-<lang>.jsonl`` per query language where there are several)
scored with pytrec_eval, on the side ``mode`` picks: a SentenceTransformer ``dense`` (exact search) or
``hybrid`` (dense + BM25, min-max fused with equal weights, as ``medadapt index --kind hybrid``); a model with
a learned-sparse side any mode (:func:`sparse_scorer`); an index its kind, or one side of a hybrid index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from medadapt.data.beir import BeirDataset, available_splits, load_beir, load_corpus, load_qrels, load_queries
from medadapt.data.jsonl import require_file
from medadapt.errors import DataError, MedAdaptError
from medadapt.eval import retrieval as eval_retrieval
from medadapt.eval.metrics import DEFAULT_METRICS, evaluate_run, parse_metric
from medadapt.eval.tasks.base import EvalSettings, EvalTask, register_task_kind
from medadapt.retrieval.config import RetrieverConfig
from medadapt.retrieval.docstore import Documents, doc_text
from medadapt.retrieval.encoders import SparseEncoder, as_encoder
from medadapt.retrieval.retriever import Retriever
from medadapt.systems import registered

__all__ = ["MODES", "RetrievalTask", "corpus_documents", "default_mode", "first_stage", "register_sparse_scorer",
           "rerank_run", "retriever_metrics", "score_retrieval", "sparse_encoder", "sparse_scorer", "supported_modes",
           "token_model"]

MODES = ("dense", "lexical", "hybrid")

#: scorers of learned-sparse encoders by ``encoder_tag``: ``fn(encoder, data, split, mode, metrics, settings)``
#: (default: an in-memory :class:`~medadapt.retrieval.Retriever`)
_SPARSE_SCORERS: dict[str, Callable] = {}


def register_sparse_scorer(tag: str, scorer: Callable) -> None:
    """Score learned-sparse encoders whose ``encoder_tag`` is ``tag`` with ``scorer`` (every mode)."""
    _SPARSE_SCORERS[tag] = scorer


def sparse_encoder(model):
    """The one check for a learned-sparse side: the encoder giving ``model``'s dense and sparse vectors, or
    ``None`` for a dense-only model and an index."""
    if isinstance(model, Retriever):
        return None
    if isinstance(model, SparseEncoder):
        return model
    if not callable(getattr(model, "encode_query", None)):
        return None
    encoder = as_encoder(model)
    return encoder if isinstance(encoder, SparseEncoder) else None


def sparse_scorer(encoder) -> Callable:
    """The scorer registered for a learned-sparse ``encoder``'s tag (here or by a system), else an index's."""
    tag = getattr(encoder, "encoder_tag", "")
    if tag not in _SPARSE_SCORERS:
        for system in registered():
            if tag in system.sparse_scorers:
                return system.sparse_scorers[tag]
    return _SPARSE_SCORERS.get(tag, _sparse_by_retriever)


def supported_modes(model) -> tuple[str, ...]:
    """The modes ``model`` offers: an index its kind (a hybrid one all three), a learned-sparse model all three,
    a dense model dense and hybrid (dense + BM25)."""
    if isinstance(model, Retriever):
        return MODES if model.kind == "hybrid" else (model.kind,)
    return MODES if sparse_encoder(model) is not None else ("dense", "hybrid")


def default_mode(model) -> str:
    """An index's kind, a learned-sparse model's ``hybrid``, a dense model's ``dense``."""
    if isinstance(model, Retriever):
        return model.kind
    return "hybrid" if sparse_encoder(model) is not None else "dense"


def corpus_documents(data: BeirDataset) -> Documents:
    """The corpus of ``data`` as the :class:`~medadapt.retrieval.docstore.Documents` an index holds."""
    docs = data.corpus.values()
    return Documents(data.doc_ids, [d["text"] for d in docs], [d["title"] for d in docs])


def retriever_metrics(retriever: Retriever, data: BeirDataset, split: str, metrics: list[str],
                      runs: list | None = None) -> dict[str, float]:
    """The metrics of ``retriever``'s results for the split's queries (depth: the largest cut-off, >= 100);
    the run is appended to ``runs`` when given."""
    depth = max([parse_metric(m)[1] for m in metrics] + [100])
    queries = data.split_queries(split)
    qids = list(queries)
    results = retriever.batch_search([queries[q] for q in qids], depth)
    run = {qid: {hit.id: hit.score for hit in res} for qid, res in zip(qids, results)}
    if runs is not None:
        runs.append(run)
    return evaluate_run(data.qrels[split], run, metrics)


def one_side(retriever: Retriever, mode: str) -> Retriever:
    """``retriever`` searching ``mode`` only (one side of a hybrid index); itself when that is its kind."""
    if mode == retriever.kind:
        return retriever
    config = RetrieverConfig(**{**retriever.config.model_dump(), "kind": mode})
    return Retriever(config, retriever.ids, retriever.docstore, retriever.encoder,
                     retriever.dense if config.uses_dense else None,
                     retriever.lexical if config.uses_lexical else None, retriever.manifest)


def _in_memory(model, data: BeirDataset, split: str, metrics: list[str], s: EvalSettings, **build) -> dict[str, float]:
    """``model`` through an index of the corpus built in memory (``build``: :meth:`Retriever.build`'s ``kind`` or
    ``config``), scored as it searches."""
    retriever = Retriever.build(corpus_documents(data), model, cache=s.cache, show_progress=s.show_progress, **build)
    return retriever_metrics(retriever, data, split, metrics, s.runs)


def _sparse_by_retriever(encoder, data: BeirDataset, split: str, mode: str, metrics: list[str],
                         s: EvalSettings) -> dict[str, float]:
    """A learned-sparse encoder through an in-memory index of the corpus (the fusion it was trained for)."""
    return _in_memory(encoder, data, split, metrics, s, kind=mode)


def token_model(model):
    """The model whose token vectors re-rank ``model``'s runs: an index's own model, else ``model`` itself."""
    if isinstance(model, Retriever):
        if model.model is None or not callable(getattr(model.model, "encode_query", None)):
            raise MedAdaptError("re-ranking an index needs its sentence-transformers model, and this index has "
                                "none (BM25 only): build it with a model (kind dense or hybrid)")
        return model.model
    return model


def score_retrieval(model, data: BeirDataset, split: str, s: EvalSettings) -> dict[str, float]:
    """The metrics of ``model`` (a model, a learned-sparse model or an index) on one BEIR split; with
    ``s.rerank``, of its run re-ranked (:func:`rerank_run`)."""
    if s.rerank is None:
        return first_stage(model, data, split, s)
    runs: list = []
    depth = getattr(s.rerank, "depth", 0)  # the first stage lists at least the re-ranked depth
    deeper = (f"recall@{depth}",) if depth > max([parse_metric(m)[1] for m in s.metrics] + [100]) else ()
    reranker = s.rerank.build(token_model(model), cache=s.cache, show_progress=s.show_progress)  # checked first
    first_stage(model, data, split, replace(s, runs=runs, metrics=(*s.metrics, *deeper)))
    if not runs:
        raise MedAdaptError(f"re-ranking needs the first stage's run; {type(model).__name__}'s scorer gives none")
    run = rerank_run(model, data, split, runs[-1], s, reranker=reranker)
    if s.runs is not None:
        s.runs.append(run)
    return evaluate_run(data.qrels[split], run, list(s.metrics))


def rerank_run(model, data: BeirDataset, split: str, run: dict, s: EvalSettings, reranker=None) -> dict:
    """``run`` re-ranked by ``reranker``, by default ``s.rerank`` built over :func:`token_model` (documents as the
    corpus encode sees them)."""
    if reranker is None:
        reranker = s.rerank.build(token_model(model), cache=s.cache, show_progress=s.show_progress)
    doc_texts = {d: data.doc_text(d) for hits in run.values() for d in hits if d in data.corpus}
    others = {d for hits in run.values() for d in hits if d not in data.corpus}
    if others and isinstance(model, Retriever):  # an index of another corpus: its own texts
        position = {d: i for i, d in enumerate(model.ids) if d in others}
        for d, i in position.items():
            doc = model.document(i)
            doc_texts[d] = doc_text(doc.get("title", ""), doc["text"])
    return reranker.rerank(data.split_queries(split), run, doc_texts)


def first_stage(model, data: BeirDataset, split: str, s: EvalSettings) -> dict[str, float]:
    """The metrics of ``model`` (a model, a learned-sparse model or an index) on one BEIR split."""
    metrics = list(s.metrics)
    if isinstance(model, Retriever):
        modes, default, encoder = supported_modes(model), model.kind, None
    else:
        encoder = sparse_encoder(model)
        modes, default = (MODES, "hybrid") if encoder is not None else (("dense", "hybrid"), "dense")
    mode = s.mode or default
    if mode not in modes:
        raise MedAdaptError(f"mode {mode}: {type(model).__name__} supports {' or '.join(modes)}")
    if isinstance(model, Retriever):
        return retriever_metrics(one_side(model, mode), data, split, metrics, s.runs)
    if encoder is not None:
        return sparse_scorer(encoder)(encoder, data, split, mode, metrics, s)
    if mode == "hybrid":  # dense + BM25, min-max fused with equal weights
        config = RetrieverConfig(kind="hybrid", batch_size=s.batch_size)
        return _in_memory(model, data, split, metrics, s, config=config)
    scores, run = eval_retrieval.evaluate_retrieval(model, data, split, metrics, cache=s.cache,
                                                    batch_size=s.batch_size, show_progress=s.show_progress,
                                                    return_run=True)
    if s.runs is not None:
        s.runs.append(run)
    return scores


@register_task_kind
class RetrievalTask(EvalTask):
    """Retrieval on a BEIR folder; ``data`` is ``{query language: BeirDataset}``."""

    kind = "retrieval"
    default_metrics = DEFAULT_METRICS
    modes = MODES

    def load(self, folder: str | Path, split: str = "test") -> RetrievalTask:
        """Read ``<folder>/<name>/`` (a suite's layout), checking that every judged id exists."""
        name = self.metadata.name
        root = Path(folder) / name
        if not root.is_dir():
            raise DataError(f"task {name} is missing from {folder}: expected the BEIR folder {root} "
                            f"(corpus.jsonl, queries.jsonl, qrels/{split}.tsv)")
        corpus_path = require_file(root / "corpus.jsonl", f"{name} corpus file")
        qpath = root / "qrels" / f"{split}.tsv"
        if not qpath.is_file():
            have = ", ".join(available_splits(root)) or "none"
            raise DataError(f"{name}: no qrels for split {split!r}: {qpath} not found (qrels splits there: {have})")
        corpus, qrels = load_corpus(corpus_path), load_qrels(qpath)
        missing_d = sorted({d for rel in qrels.values() for d in rel if d not in corpus})
        if missing_d:
            raise DataError(f"{qpath}: {len(missing_d)} document id(s) not in {corpus_path}, e.g. {missing_d[:3]}")
        multi = len(self.metadata.query_languages) > 1
        per_lang, paths = {}, [corpus_path, qpath]
        for lang in self.metadata.query_languages:
            qfile = require_file(root / (f"queries-{lang}.jsonl" if multi else "queries.jsonl"),
                                 f"{name} queries file ({lang})")
            queries = load_queries(qfile)
            missing_q = [q for q in qrels if q not in queries]
            if missing_q:
                raise DataError(f"{qpath}: {len(missing_q)} query id(s) not in {qfile}, e.g. {missing_q[:3]}")
            per_lang[lang] = BeirDataset(corpus=corpus, queries=queries, qrels={split: qrels}, root=root)
            paths.append(qfile)
        return self.with_data(per_lang, paths, split)

    def load_data(self, data: str | Path, split: str = "test") -> RetrievalTask:
        """Read a BEIR folder or a builtin data set (``medmini``) for ``split``."""
        dataset = data if isinstance(data, BeirDataset) else load_beir(data, [split])
        root = dataset.root if dataset.root is not None else Path(str(data))
        return self.with_data({self.metadata.query_languages[0]: dataset}, [root], split)

    def score(self, model, settings: EvalSettings) -> dict[str, dict[str, float]]:
        return {lang: score_retrieval(model, data, self.split, settings) for lang, data in self.data.items()}

    @property
    def dataset(self) -> BeirDataset:
        """The loaded split of the first query language (what the mteb export reads)."""
        return next(iter(self.data.values()))
