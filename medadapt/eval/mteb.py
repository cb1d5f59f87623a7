"""The ``mteb`` package as a first-class client: MTEB itself evaluates medadapt models on local data.

mteb (>= 2) does the evaluation here; medadapt only hands it what it cannot fetch without internet:

* :func:`local_retrieval_task` builds an ``mteb`` ``AbsTaskRetrieval`` from a local BEIR folder at run time
  (the corpus, queries and qrels of one split, read by medadapt's loader, which refuses repeated ids: mteb
  keeps every query row, dict-based clients keep the last, and the two then disagree). Nothing is
  downloaded. With ``like="SomeMTEBTask"`` the task takes a registered MTEB task's metadata (name, main
  score, languages, instructions), so its result files are filed under that task.
* :func:`named_task` loads a registered MTEB task (``mteb.get_task``) whose data is local: a BEIR folder
  (retrieval tasks), or a local copy of the task's Hugging Face dataset repository (any task type, read by
  mteb's own loader with the hub offline). Data that is not local is one clear error (no internet here).
* :func:`mteb_model` wraps any medadapt model (a MoE head, adapter-only or full; a CARE asymmetric
  ``Router``; a BMRetriever instruction model; the dense side of a HyReC model) in mteb's own
  ``SentenceTransformerEncoderWrapper``, so queries go through ``encode_query`` and documents through
  ``encode_document`` with the model's ``query`` / ``document`` prompts, exactly as mteb runs any
  Sentence-Transformers model. Its :class:`ModelMeta <mteb.models.ModelMeta>` carries the model's name
  (``model_card_data.model_name``, set by :func:`medadapt.load`) and a revision (the weights fingerprint),
  so mteb's result cache keeps two models apart.
* :func:`run_mteb` runs ``mteb.evaluate`` and returns its scores; with ``output=DIR`` mteb writes its result
  files under ``DIR`` (``results/<model>/<revision>/<task>.json``, the layout of ``mteb.ResultCache``).
  ``use_cache=True`` reads embeddings through medadapt's embedding cache (:class:`CachedEncoder`): the
  same vectors the model's ``encode_query`` / ``encode_document`` give, without re-encoding a corpus that
  ``medadapt eval`` already encoded; mteb still does the search, the scoring and the files.

Only the glue is written here; retrieval, scoring, prompts and result files are mteb's.
"""

from __future__ import annotations

import hashlib
import re
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medadapt.errors import DataError, MedAdaptError

if TYPE_CHECKING:  # pragma: no cover
    from medadapt.data.beir import BeirDataset

__all__ = ["local_retrieval_task", "medadapt_scores", "model_identity", "mteb_model", "named_task", "require_mteb", "result_path",
           "run_mteb", "task_name_for"]

#: Scores of mteb's retrieval result (``ndcg_at_10``) under medadapt's metric names (``ndcg@10``).
_MTEB_PREFIXES = {"ndcg_at_": "ndcg", "recall_at_": "recall", "map_at_": "map", "mrr_at_": "mrr",
                  "precision_at_": "precision", "hit_rate_at_": "accuracy"}


def require_mteb():
    """The ``mteb`` module, or one clear error naming the extra to install."""
    try:
        import mteb
    except ImportError:
        raise MedAdaptError("MTEB evaluation needs the mteb package: pip install 'medadapt[mteb]'") from None
    return mteb


def task_name_for(data_root: str | Path) -> str:
    """A task name for a local folder: its name with anything but letters, digits, ``_`` and ``-`` removed
    (it becomes a file name in mteb's results), e.g. ``medquad``."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "", Path(str(data_root)).resolve().name) or "local"
    return name


def _data_revision(data: BeirDataset, split: str) -> str:
    """A content hash of the split as evaluated (documents, judged queries, qrels): the task's dataset
    revision in mteb's result files, so results on edited data are not confused with the old ones."""
    h = hashlib.sha256(b"medadapt-beir-1")
    for did, doc in data.corpus.items():
        h.update(f"{did}\t{doc.get('title') or ''}\t{doc['text']}\n".encode())
    for qid, text in data.split_queries(split).items():
        h.update(f"{qid}\t{text}\n".encode())
    for qid, docs in data.qrels[split].items():
        for did, grade in docs.items():
            h.update(f"{qid}\t{did}\t{grade}\n".encode())
    return h.hexdigest()[:16]


def _split_data(data: BeirDataset, split: str) -> dict[str, Any]:
    """mteb's ``RetrievalSplitData`` for ``split`` of a loaded BEIR folder (``datasets.Dataset`` corpus and
    queries, qrels as ``{qid: {doc_id: grade}}``)."""
    from datasets import Dataset

    if split not in data.qrels:
        raise DataError(f"split {split!r} was not loaded (loaded: {', '.join(data.qrels) or 'none'})")
    queries = data.split_queries(split)
    corpus = Dataset.from_dict({
        "id": list(data.corpus),
        "title": [d.get("title") or "" for d in data.corpus.values()],
        "text": [d["text"] for d in data.corpus.values()],
    })
    query_ds = Dataset.from_dict({"id": list(queries), "text": list(queries.values())})
    qrels = {qid: {did: int(g) for did, g in docs.items()} for qid, docs in data.qrels[split].items()}
    return {"corpus": corpus, "queries": query_ds, "relevant_docs": qrels, "top_ranked": None}


def local_retrieval_task(data: BeirDataset | str | Path, split: str = "test", *, name: str | None = None,
                         languages: list[str] | None = None, like: str | None = None,
                         description: str | None = None):
    """An mteb retrieval task over ``split`` of a local BEIR folder (or loaded :class:`BeirDataset`).

    Args:
        name: the task name in mteb's results (default: the folder's name, :func:`task_name_for`).
        languages: mteb language codes (``["eng-Latn"]`` by default).
        like: a registered MTEB retrieval task (``"NFCorpus"``, ``"CUREv1Retrieval"`` ...) whose metadata
            (name, main score, languages, prompt, type) the task takes; the data is still the folder's.
        description: the task description (default: the folder it came from).

    Returns an instance of an ``AbsTaskRetrieval`` subclass built at run time, its data already loaded.
    """
    mteb = require_mteb()
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.task_metadata import TaskMetadata

    from medadapt.data import load_beir

    if not hasattr(data, "corpus"):
        data = load_beir(data, [split])
    root = getattr(data, "root", None)
    revision = _data_revision(data, split)
    if like is not None:
        try:
            template = mteb.get_task(like)
        except (KeyError, ValueError) as exc:
            raise MedAdaptError(f"unknown MTEB task {like!r} ({exc})") from None
        if not isinstance(template, AbsTaskRetrieval):
            raise MedAdaptError(f"MTEB task {like!r} is a {template.metadata.type} task; a BEIR folder can stand in "
                                "for retrieval tasks only (give a local copy of its dataset repository instead)")
        langs = template.metadata.eval_langs
        if isinstance(langs, dict):  # one BEIR folder is one subset: keep all its languages under "default"
            langs = sorted({code for codes in langs.values() for code in codes})
        metadata = template.metadata.model_copy(update={
            "dataset": {"path": str(root or like), "revision": revision}, "eval_splits": [split],
            "eval_langs": languages or langs})
        base: type = type(template)
    else:
        metadata = TaskMetadata(
            name=name or task_name_for(root or "local"),
            description=description or f"Local BEIR folder {root or '(in memory)'}, split {split}, "
                                       "evaluated through medadapt.",
            dataset={"path": str(root or "local"), "revision": revision},
            type="Retrieval", category="t2t", modalities=["text"], eval_splits=[split],
            eval_langs=languages or ["eng-Latn"], main_score="ndcg_at_10",
        )
        base = AbsTaskRetrieval
    split_data = _split_data(data, split)

    def load_data(self, num_proc=None, **kwargs) -> None:
        if not self.data_loaded:
            self.dataset = {"default": {split: dict(split_data)}}
            self.data_loaded = True

    cls = type(f"MedadaptLocal_{metadata.name}", (base,), {
        "metadata": metadata, "load_data": load_data, "dataset_transform": lambda self, *a, **k: None,
        "__module__": __name__})
    task = cls()
    task.load_data()
    return task


def _looks_like_hf_dataset(path: Path) -> bool:
    """A local copy of a Hugging Face dataset repository (``README.md`` with ``configs``, or data files)."""
    readme = path / "README.md"
    if readme.is_file() and "configs:" in readme.read_text(encoding="utf-8", errors="replace"):
        return True
    return any(path.rglob("*.parquet")) or any(path.glob("*/*.jsonl")) or any(path.glob("*/*.jsonl.gz"))


def named_task(name: str, data: str | Path | None = None, split: str | None = None):
    """The registered MTEB task ``name`` with its data read from local files.

    ``data`` is a BEIR folder (retrieval tasks: :func:`local_retrieval_task` with the task's metadata), a
    local copy of the task's Hugging Face dataset repository (any task type: mteb's own loader reads it, the
    hub offline), or ``None`` (mteb's loader with the hub offline: works when the Hugging Face datasets cache
    already holds the data). Data that is not there is one :class:`MedAdaptError` saying how to get it.
    """
    mteb = require_mteb()
    try:
        task = mteb.get_task(name, eval_splits=[split] if split else None)
    except (KeyError, ValueError) as exc:
        raise MedAdaptError(f"unknown MTEB task {name!r} ({str(exc).splitlines()[0][:300]})") from None
    split = split or task.eval_splits[0]
    repo = task.metadata.dataset.get("path")
    how = (f"the data of MTEB task {name!r} is not local and there is no internet here: download it where "
           f"there is (e.g. `hf download {repo} --repo-type dataset --local-dir DIR`, or a BEIR export of a "
           "retrieval task) and pass --data DIR")
    if data is not None:
        path = Path(data).expanduser()
        if not path.is_dir():
            raise DataError(f"{path}: not a folder ({how})")
        if (path / "corpus.jsonl").is_file() or (path / "corpus.jsonl.gz").is_file():
            return local_retrieval_task(path, split, like=name)
        if not _looks_like_hf_dataset(path):
            raise DataError(f"{path}: neither a BEIR folder (corpus.jsonl, queries.jsonl, qrels/{split}.tsv) nor a "
                            "local copy of a Hugging Face dataset repository (README.md with configs, data files)")
        # on the instance: the metadata object is shared by every instance of the task class
        task.metadata = task.metadata.model_copy(update={"dataset": {**task.metadata.dataset,
                                                                     "path": str(path.resolve())}})
    import os

    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    os.environ.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    try:
        task.load_data()
    except MedAdaptError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets / hub raise many types when data is not there
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise MedAdaptError(f"{how} ({type(exc).__name__}: {first})") from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return task


def model_identity(model, name: str | None = None, revision: str | None = None) -> tuple[str, str]:
    """``(name, revision)`` of ``model`` in mteb's results.

    The name is ``name``, else ``model_card_data.model_name`` (set by :func:`medadapt.load` for local
    folders), else ``model_card_data.base_model``, else ``medadapt/unnamed``; mteb wants ``org/name``, so a
    name without ``/`` gets ``medadapt/`` in front. The revision is ``revision``, else the fingerprint of the
    weights as they are now (:func:`medadapt.models.model_fingerprint`; a model trained after loading gets a
    new one).
    """
    from medadapt.models import model_fingerprint

    card = getattr(model, "model_card_data", None)
    name = name or getattr(card, "model_name", None) or getattr(card, "base_model", None) or "medadapt/unnamed"
    name = str(name).strip()
    if "/" not in name:
        name = f"medadapt/{name}"
    return name, revision or model_fingerprint(model)


def mteb_model(model, *, name: str | None = None, revision: str | None = None, use_cache: bool = False,
               cache=None, batch_size: int = 64):
    """mteb's ``SentenceTransformerEncoderWrapper`` around ``model`` (queries through ``encode_query``,
    documents through ``encode_document``, the model's ``query`` / ``document`` prompts), its ``ModelMeta``
    carrying :func:`model_identity`. ``use_cache=True``: a :class:`CachedEncoder` reading embeddings
    through medadapt's embedding cache (``cache``, default ``$MEDADAPT_CACHE``)."""
    require_mteb()
    from mteb.models import SentenceTransformerEncoderWrapper

    model_name, model_revision = model_identity(model, name, revision)
    cls = _cached_encoder_class() if use_cache else SentenceTransformerEncoderWrapper
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mteb warns about its own deprecated arguments here
        wrapper = cls(model)
    wrapper.mteb_model_meta = wrapper.mteb_model_meta.model_copy(update={"name": model_name,
                                                                          "revision": model_revision})
    if use_cache:
        from medadapt.cache import EmbeddingCache

        wrapper.medadapt_cache = cache if cache is not None else EmbeddingCache()
        wrapper.medadapt_batch_size = batch_size
    return wrapper


def _cached_encoder_class():
    if "CachedEncoder" in globals():
        return globals()["CachedEncoder"]
    require_mteb()
    from mteb.models import SentenceTransformerEncoderWrapper
    from mteb.models.abs_encoder import get_prompt_name
    from mteb.types import PromptType

    class CachedEncoder(SentenceTransformerEncoderWrapper):
        """mteb's Sentence-Transformers wrapper whose ``encode`` reads embeddings through medadapt's
        :class:`~medadapt.cache.EmbeddingCache`: the role (``encode_query`` / ``encode_document``) and the
        prompt mteb resolves for the task are the cache key, so the vectors are the ones the wrapped model
        gives for the same call. Written here because mteb's cache wrappers key by text only and know nothing
        of medadapt's per-route, per-prompt namespaces."""

        medadapt_cache = None
        medadapt_batch_size = 64

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            texts = [text for batch in inputs for text in batch["text"]]
            name = get_prompt_name(self.model_prompts, task_metadata, prompt_type)
            prompt = (self.model_prompts or {}).get(name) if name else None
            role = {PromptType.query: "query", PromptType.document: "document"}.get(prompt_type, "plain")
            return self.medadapt_cache.encode(
                self.model, texts, role=role, prompt=prompt,
                batch_size=int(kwargs.get("batch_size") or self.medadapt_batch_size),
                show_progress=bool(kwargs.get("show_progress_bar", False)),
                desc=f"encoding {role}s")

    globals()["CachedEncoder"] = CachedEncoder
    return CachedEncoder


def __getattr__(attr: str):  # CachedEncoder subclasses an mteb class: built on first use (mteb is optional)
    if attr == "CachedEncoder":
        return _cached_encoder_class()
    raise AttributeError(attr)


def medadapt_scores(task_scores: dict[str, Any]) -> dict[str, float]:
    """mteb's retrieval scores (``ndcg_at_10`` ...) under medadapt's metric names (``ndcg@10`` ...)."""
    out: dict[str, float] = {}
    for key, value in task_scores.items():
        for prefix, metric in _MTEB_PREFIXES.items():
            if key.startswith(prefix) and key[len(prefix):].isdigit() and isinstance(value, (int, float)):
                out[f"{metric}@{key[len(prefix):]}"] = float(value)
    return out


def run_mteb(model, task, *, output: str | Path | None = None, name: str | None = None,
             revision: str | None = None, use_cache: bool = False, cache=None, batch_size: int = 64,
             overwrite: bool = True, show_progress: bool = False) -> dict[str, Any]:
    """Evaluate ``model`` (a SentenceTransformer, or an mteb encoder from :func:`mteb_model`) on ``task``
    (an mteb task: :func:`local_retrieval_task`, :func:`named_task`, ``mteb.get_task(...)``) with
    ``mteb.evaluate``.

    Args:
        output: folder of mteb's result cache: result files land in
            ``output/results/<model name>/<revision>/<task>.json`` with ``model_meta.json``; ``None``: none.
        overwrite: re-run even when ``output`` already holds a result for this model, revision and task
            (``False``: mteb's ``only-missing``, the cached result is returned).

    Returns ``{"task", "model", "revision", "seconds", "scores": {split: {subset: mteb scores}},
    "main_score", "medadapt": {metric: value}}`` (``medadapt``: the first split and subset's scores under
    medadapt's metric names).
    """
    mteb = require_mteb()
    from sentence_transformers import SentenceTransformer

    wrapped = mteb_model(model, name=name, revision=revision, use_cache=use_cache, cache=cache,
                         batch_size=batch_size) if isinstance(model, SentenceTransformer) else model
    result_cache = None
    if output is not None:
        Path(output).mkdir(parents=True, exist_ok=True)
        result_cache = mteb.ResultCache(cache_path=str(output))
    import datasets

    bars_were_off = datasets.is_progress_bar_enabled() is False
    if not show_progress:  # mteb maps the corpus through `datasets`, which draws its own bars
        datasets.disable_progress_bars()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model_result = mteb.evaluate(
                wrapped, task, cache=result_cache, overwrite_strategy="always" if overwrite else "only-missing",
                encode_kwargs={"batch_size": batch_size, "show_progress_bar": show_progress},
                show_progress_bar=show_progress)
    finally:
        if not bars_were_off:
            datasets.enable_progress_bars()
    seconds = time.perf_counter() - t0
    if not model_result.task_results:
        raise MedAdaptError(f"mteb returned no result for task {task.metadata.name}")
    task_result = model_result.task_results[0]
    scores = {split: {entry["hf_subset"]: dict(entry) for entry in entries}
              for split, entries in task_result.scores.items()}
    first = next(iter(next(iter(scores.values())).values()))
    meta = wrapped.mteb_model_meta
    return {"task": task.metadata.name, "model": meta.name, "revision": meta.revision, "seconds": seconds,
            "scores": scores, "main_score": first.get("main_score"), "medadapt": medadapt_scores(first)}


def result_path(output: str | Path, result: dict[str, Any]) -> Path:
    """Where :func:`run_mteb` with ``output`` wrote ``result`` (mteb's ``ResultCache`` layout)."""
    mteb = require_mteb()
    return mteb.ResultCache(cache_path=str(output)).get_task_result_path(
        task_name=result["task"], model_name=result["model"].replace("/", "__").replace(" ", "_"),
        model_revision=result["revision"])


def _check_agreement(ours: dict[str, float], theirs: dict[str, float], console, tolerance: float = 0.002) -> None:
    """Warn (one line) when mteb's and medadapt's figures for the same metric differ by more than
    ``tolerance``."""
    from medadapt.errors import warn

    for metric, value in ours.items():
        other = theirs.get(metric)
        if other is not None and abs(other - value) > tolerance:
            warn(f"mteb gives {metric} {other:.5f}, medadapt {value:.5f} (difference above {tolerance}); "
                 "check the data for repeated ids and the model's prompts")


def _verbose() -> bool:
    """mteb draws its own tqdm bars: like every library's, the CLI shows them only with ``--verbose``."""
    from medadapt.progress import level

    return level() == "verbose"


def cli_write_mteb(model, dataset: BeirDataset, split: str, results: dict[str, float], output: str | Path,
                   cache, batch_size: int = 64, quiet: bool = False, console=None) -> dict[str, Any]:
    """``medadapt eval ... --mteb-output DIR``: mteb evaluates ``model`` on the same split (embeddings
    through medadapt's cache, so nothing is encoded twice) and writes its result files under ``DIR``."""
    task = local_retrieval_task(dataset, split)
    result = run_mteb(model, task, output=output, use_cache=True, cache=cache, batch_size=batch_size,
                      show_progress=not quiet and _verbose())
    _check_agreement(results, result["medadapt"], console)
    if console is not None:
        console.print(f"mteb {task.metadata.name} ({result['model']} @ {result['revision']}): main score "
                      f"{result['main_score']:.5f}; wrote {result_path(output, result)}")
    return result


def cli_mteb_task(name: str, model: str, data: str | None, split: str, output: str | Path | None,
                  mteb_output: str | Path | None, *, device=None, cache_dir=None, no_cache: bool = False,
                  batch_size: int = 64, quiet: bool = False, console=None) -> dict[str, Any]:
    """``medadapt eval --mteb-task NAME --data DIR``: the registered MTEB task on local data (``--data``
    left at its default ``medmini`` means no folder: mteb's own loader, offline), a table of its scores,
    ``--output`` as a flat JSON of them, ``--mteb-output`` for mteb's result files."""
    import tempfile

    from medadapt.cache import EmbeddingCache
    from medadapt.eval.report import results_table, write_json
    from medadapt.models import load

    local = None if data in (None, "medmini") else data
    task = named_task(name, local, split)
    st_model = load(model, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        result = run_mteb(st_model, task, output=mteb_output, use_cache=True,
                          cache=EmbeddingCache(tmp if no_cache else cache_dir), batch_size=batch_size,
                          show_progress=not quiet and _verbose())
    flat = result["medadapt"] or {k: float(v) for k, v in next(iter(next(iter(result["scores"].values())).values()))
                                  .items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    flat = {"main_score": float(result["main_score"]), **flat}
    if console is not None:
        console.print(results_table({f"{result['model']} on {result['task']}": flat}, "mteb",
                                    title=f"mteb {result['task']} ({result['seconds']:.1f} s)"))
        if mteb_output is not None:
            console.print(f"wrote {result_path(mteb_output, result)}")
    if output:
        write_json(output, flat)
        if console is not None:
            console.print(f"wrote {output}")
    return result
