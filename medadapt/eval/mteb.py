"""The ``mteb`` package as a client: MTEB itself evaluates medadapt models on local data (no internet).

Tasks come from local BEIR folders or registered MTEB tasks read from local files; models are wrapped with a
``ModelMeta`` that names them (weights fingerprint as revision) and says where they come from (base model,
training data as MTEB task names), so mteb's own ``is_zero_shot_on`` flags a leak. Retrieval, scoring, prompts
and result files are mteb's (docs/evaluation.md)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import yaml

from medadapt.adapters.files import ADAPTER_CONFIG
from medadapt.cache import EmbeddingCache
from medadapt.data import load_beir
from medadapt.errors import ConfigError, DataError, MedAdaptError, warn
from medadapt.eval.report import results_table, write_json
from medadapt.eval.tasks import EvalTask
from medadapt.eval.tasks.retrieval import sparse_encoder
from medadapt.io import atomic_write_text
from medadapt.models import ALIAS_NAMES, ALIASES, load, model_fingerprint, model_name_for
from medadapt.progress import level
from medadapt.yaml_input import load_yaml, read_yaml

if TYPE_CHECKING:  # pragma: no cover
    from medadapt.data.beir import BeirDataset

__all__ = ["MTEB_SOURCES", "PROVENANCE_FILE", "Provenance", "leak_message", "local_retrieval_task", "medadapt_scores",
           "model_identity", "model_provenance", "mteb_model", "mteb_task_of", "mteb_tasks_for", "named_task",
           "recipe_base_model", "recipe_training_data", "require_mteb", "result_path", "run_mteb", "task_name_for"]

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
    """A folder's name with anything but letters, digits, ``_`` and ``-`` removed (a file name in mteb's
    results), e.g. ``medquad``."""
    return re.sub(r"[^A-Za-z0-9_-]+", "", Path(str(data_root)).resolve().name) or "local"


def _data_revision(data: BeirDataset, split: str) -> str:
    """A content hash of the split (documents, judged queries, qrels): the task's dataset revision in mteb's
    result files, so results on edited data are not confused with the old ones."""
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
    """An mteb ``AbsTaskRetrieval`` (a subclass built at run time, data loaded) over ``split`` of a local BEIR
    folder or loaded :class:`BeirDataset`. ``like``: a registered MTEB retrieval task whose metadata (name,
    main score, languages, prompt) it takes; ``name`` defaults to the folder's (:func:`task_name_for`),
    ``languages`` to ``["eng-Latn"]``. The corpus, queries and qrels are medadapt's loader's (repeated ids
    refused: mteb and dict-based clients would disagree)."""
    mteb = require_mteb()
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.task_metadata import TaskMetadata

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
    """The registered MTEB task ``name`` with its data read from local files: ``data`` is a BEIR folder
    (retrieval tasks), a local copy of the task's Hugging Face dataset repository (any task type, read by mteb
    with the hub offline) or ``None`` (the Hugging Face datasets cache). Missing data is one
    :class:`MedAdaptError` saying how to get it."""
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
    try:
        with mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}):
            task.load_data()
    except MedAdaptError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets / hub raise many types when data is not there
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise MedAdaptError(f"{how} ({type(exc).__name__}: {first})") from None
    return task


#: MTEB tasks built from a data set medadapt trains on, by the set's name in lower case, letters and digits only
#: (:func:`mteb_tasks_for`; other names are looked up among MTEB's task names: ``nfcorpus`` -> ``NFCorpus``).
MTEB_SOURCES: dict[str, tuple[str, ...]] = {
    # MedicalQARetrieval is MedQuAD's question / answer pairs (its reference: Ben Abacha & Demner-Fushman 2019)
    "medquad": ("MedicalQARetrieval",),
    "medquadmini": ("MedicalQARetrieval",),  # the builtin medquad-mini: MedQuAD topic clusters
    # ChatDoctorRetrieval is ChatDoctor_HealthCareMagic (BMRetriever's "healthcaremagic" fine-tuning set)
    "healthcaremagic": ("ChatDoctorRetrieval",),
    "chatdoctor": ("ChatDoctorRetrieval",),
    "chatdoctorhealthcaremagic": ("ChatDoctorRetrieval",),
    # cMedQA v1 / v2 (CMedTEB's rerank sets); mteb itself relates CmedqaRetrieval to CMedQAv2-reranking
    "cmedqa": ("CMedQAv1-reranking",),
    "cmedqav1": ("CMedQAv1-reranking",),
    "cmedqa2": ("CMedQAv2-reranking",),
    "cmedqav2": ("CMedQAv2-reranking",),
    "cure": ("CUREv1",),  # clinia/CUREv1
}

#: medadapt's record beside ``model_meta.json`` (not ``*.json``: mteb's result cache reads those as results).
PROVENANCE_FILE = "medadapt_provenance.yaml"


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@functools.lru_cache(maxsize=1)
def _registered_tasks() -> dict[str, str]:
    """MTEB's task names by :func:`_norm` (the tasks ``mteb.get_tasks`` lists, superseded ones included)."""
    mteb = require_mteb()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tasks = mteb.get_tasks(exclude_superseded=False)
    return {_norm(task.metadata.name): task.metadata.name for task in tasks}


def mteb_tasks_for(name: str) -> tuple[str, ...]:
    """The MTEB tasks built from the data set ``name`` as a recipe names it (``medquad-mini``,
    ``../data/medquad``, ``finetune/medquad.jsonl``): :data:`MTEB_SOURCES`, else the MTEB task of the same name
    (case, ``-`` and ``_`` aside); ``()`` when it is no MTEB task's."""
    stem = Path(str(name).strip().rstrip("/\\")).name
    for suffix in (".gz", ".jsonl", ".json", ".tsv", ".parquet", ".csv"):
        stem = stem[: -len(suffix)] if stem.lower().endswith(suffix) else stem
    key = _norm(stem)
    if not key:
        return ()
    if key in MTEB_SOURCES:
        return MTEB_SOURCES[key]
    found = _registered_tasks().get(key)
    return (found,) if found else ()


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _mapping(obj: Any, key: str) -> dict:
    """``obj[key]`` when both are mappings, else ``{}`` (a hand-edited recipe.yaml may hold anything)."""
    return _dict(_dict(obj).get(key))


def recipe_training_data(recipe: dict) -> list[str]:
    """The data sets a ``recipe.yaml`` mapping trains on, as it names them: ``data.path``, ``data.mix``,
    ``pretrain.data`` / ``prefinetune.data``, ``stage1.sources``, ``stage2.tasks``, ``stage2.synthetic.corpus``
    (not ``eval``). A set a disabled stage would read counts: a false leak warning is cheaper than a missed one."""
    data, stage2 = _mapping(recipe, "data"), _mapping(recipe, "stage2")

    def paths(section: dict, key: str) -> list:
        return [_dict(entry).get("path") for entry in section.get(key) or []]

    values = [data.get("path"), *paths(data, "mix"), _mapping(recipe, "pretrain").get("data"),
              _mapping(recipe, "prefinetune").get("data"), *paths(_mapping(recipe, "stage1"), "sources"),
              *paths(stage2, "tasks"),  # a task without a path reads data.path
              _mapping(stage2, "synthetic").get("corpus")]
    return list(dict.fromkeys(v for v in values if isinstance(v, str) and v.strip()))


def recipe_base_model(recipe: dict) -> str | None:
    """The pretrained model a recipe starts from: ``model.backbone``, ``model.name``, else the document tower's
    ``document.model`` (an asymmetric recipe aligns its query tower to it), else ``query.model``."""
    for value in (_mapping(recipe, "model").get("backbone"), _mapping(recipe, "model").get("name"),
                  _mapping(recipe, "document").get("model"), _mapping(recipe, "query").get("model")):
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _model_label(value: str, folder: Path | None = None) -> str:
    """The MTEB name of the model ``value`` names: the name :func:`medadapt.load` gives it (a relative folder
    is looked for from here, then from ``folder``), a hub id as it is, ``local/<name>`` for a folder now gone."""
    key = value.strip()
    if key.lower() in ALIAS_NAMES:
        return ALIAS_NAMES[key.lower()]
    if key.lower() in ALIASES:  # medadapt's tiny random models: named without building them
        return f"medadapt/{key.lower()}"
    path = Path(key).expanduser()
    for candidate in ([path] if path.is_absolute() or folder is None else [path, folder / path]):
        if candidate.is_dir():
            return model_name_for(str(candidate), str(candidate))
    if key.count("/") == 1 and not key.startswith((".", "/", "~")):
        return key  # a hub id
    return f"local/{path.name or key}"


def _adapter_base(config: dict, folder: Path) -> str | None:
    """The base model an adapter folder's ``medadapt_adapter.json`` records, as :func:`_model_label`."""
    base = _mapping(config, "base_model")
    relative = base.get("relative_path")
    if isinstance(relative, str) and (folder / relative).is_dir():
        return _model_label(str(folder / relative))
    for value in (config.get("base_model_name_or_path"), base.get("name")):
        if isinstance(value, str) and value.strip():
            return _model_label(value, folder)
    if isinstance(base.get("folder_name"), str):
        return f"local/{base['folder_name']}"
    return None


def _card_base(folder: Path) -> str | None:
    """``base_model:`` of the model card's front matter (``README.md``), read with the YAML input policy."""
    path = folder / "README.md"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    match = re.match(r"---\r?\n(.*?)\r?\n---\r?\n", text, re.DOTALL)
    if not match:
        return None
    try:
        front, _ = load_yaml(match.group(1), str(path))
    except ConfigError:
        return None
    base = front.get("base_model") if isinstance(front, dict) else None
    base = base[0] if isinstance(base, list) and base else base
    return _model_label(base, folder) if isinstance(base, str) and base.strip() else None


@dataclass(frozen=True)
class Provenance:
    """Where a model comes from, for MTEB's ``ModelMeta``: ``adapted_from``, ``training_data`` (each data set
    as its recipe names it -> its MTEB tasks, ``()`` for local data; ``None``: unknown), ``source`` (the folder
    read) and ``read`` (its files that said so). ``ModelMeta`` holds MTEB task names only and refuses extra
    keys, so local data is kept in medadapt's own record (:attr:`local_training_data`, :data:`PROVENANCE_FILE`)."""

    adapted_from: str | None = None
    training_data: dict[str, tuple[str, ...]] | None = None
    source: str | None = None
    read: tuple[str, ...] = ()

    @property
    def training_datasets(self) -> set[str] | None:
        """MTEB's ``training_datasets``: the MTEB tasks of the training data (``None``: unknown)."""
        if self.training_data is None:
            return None
        return {task for tasks in self.training_data.values() for task in tasks}

    @property
    def local_training_data(self) -> list[str]:
        """The training data sets that are no MTEB task's, as their recipe names them."""
        return [name for name, tasks in (self.training_data or {}).items() if not tasks]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "read": list(self.read), "adapted_from": self.adapted_from,
                "training_data": None if self.training_data is None else
                {name: list(tasks) for name, tasks in self.training_data.items()},
                "training_datasets": None if self.training_data is None else sorted(self.training_datasets),
                "local_training_data": self.local_training_data}


def model_provenance(source: str | Path | None, model=None) -> Provenance:
    """The :class:`Provenance` of the model loaded from ``source``: a folder's ``medadapt_adapter.json``,
    ``recipe.yaml`` and model card; otherwise ``model``'s card (``base_model``), training data unknown. An
    unreadable ``recipe.yaml`` is a warning (no training data recorded): the model itself loaded."""
    folder = Path(str(source)).expanduser() if source is not None else None
    if folder is not None and not folder.is_dir():
        folder = None
    adapted, data, read = None, None, []
    if folder is not None:
        config_path = folder / ADAPTER_CONFIG
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                config = None
            if isinstance(config, dict):
                adapted = _adapter_base(config, folder)
                read.append(ADAPTER_CONFIG)
        recipe_path = folder / "recipe.yaml"
        if recipe_path.is_file():
            try:
                recipe, _ = read_yaml(recipe_path)
                if not isinstance(recipe, dict):
                    raise ConfigError(f"{recipe_path}: not a recipe (a YAML mapping of sections)")
            except ConfigError as exc:
                warn(f"{exc}; the MTEB metadata of {folder.name} records no training data")
            else:
                data = {name: mteb_tasks_for(name) for name in recipe_training_data(recipe)}
                backbone = recipe_base_model(recipe)
                adapted = adapted or (_model_label(backbone, folder) if backbone else None)
                read.append("recipe.yaml")
        if adapted is None:
            adapted = _card_base(folder)
            if adapted is not None:
                read.append("README.md")
    if adapted is None and model is not None:
        base = getattr(getattr(model, "model_card_data", None), "base_model", None)
        adapted = base if isinstance(base, str) and base.strip() else None
    return Provenance(adapted_from=adapted, training_data=data,
                      source=None if source is None else str(source), read=tuple(read))


def model_identity(model, name: str | None = None, revision: str | None = None) -> tuple[str, str]:
    """``(name, revision)`` of ``model`` in mteb's results: ``name``, else the card's ``model_name`` or
    ``base_model``, else ``medadapt/unnamed`` (``medadapt/`` put in front of a name without ``/``); ``revision``,
    else the fingerprint of the weights as they are now."""
    card = getattr(model, "model_card_data", None)
    name = name or getattr(card, "model_name", None) or getattr(card, "base_model", None) or "medadapt/unnamed"
    name = str(name).strip()
    if "/" not in name:
        name = f"medadapt/{name}"
    return name, revision or model_fingerprint(model)


def mteb_model(model, *, name: str | None = None, revision: str | None = None, use_cache: bool = False,
               cache=None, batch_size: int = 64, source: str | Path | None = None,
               provenance: Provenance | None = None):
    """mteb's ``SentenceTransformerEncoderWrapper`` around ``model`` (``encode_query`` / ``encode_document``
    with the model's prompts); ``use_cache=True``: a :class:`CachedEncoder` (medadapt's embedding cache).
    Its ``ModelMeta`` carries :func:`model_identity`, width, parameter count, ``use_instructions`` and the
    prompts, and the :class:`Provenance` (``provenance``, else :func:`model_provenance` of ``source``); a model
    that is no medadapt run but is in mteb's registry takes the registry's training data and base."""
    mteb = require_mteb()
    from mteb.models import SentenceTransformerEncoderWrapper

    model_name, model_revision = model_identity(model, name, revision)
    cls = _cached_encoder_class() if use_cache else SentenceTransformerEncoderWrapper
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mteb warns about its own deprecated arguments here
        wrapper = cls(model)
    prov = provenance if provenance is not None else model_provenance(source, model)
    training, adapted = prov.training_datasets, prov.adapted_from
    if training is None and not prov.read:  # no medadapt run: a model mteb's registry knows (an alias, a hub id)?
        try:
            known = mteb.get_model_meta(model_name)
        except (KeyError, ValueError):
            known = None
        if known is not None:
            training, adapted = known.training_datasets, known.adapted_from or adapted
    meta = wrapper.mteb_model_meta
    prompts = {key: value for key, value in (wrapper.model_prompts or {}).items() if value}
    update: dict[str, Any] = {"name": model_name, "revision": model_revision, "use_instructions": bool(prompts),
                              "training_datasets": training,
                              "n_parameters": int(sum(p.numel() for p in model.parameters()))}
    if adapted:
        update["adapted_from"] = adapted
    if prompts:
        update["loader_kwargs"] = {**(meta.loader_kwargs or {}), "model_prompts": prompts}
    if meta.embed_dim is None:
        update["embed_dim"] = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") \
            else model.get_sentence_embedding_dimension()
    wrapper.mteb_model_meta = meta.model_copy(update=update)
    wrapper.medadapt_provenance = prov
    if use_cache:
        wrapper.medadapt_cache = cache if cache is not None else EmbeddingCache()
        wrapper.medadapt_batch_size = batch_size
    return wrapper


@functools.cache
def _cached_encoder_class():
    require_mteb()
    from mteb.models import SentenceTransformerEncoderWrapper
    from mteb.models.abs_encoder import get_prompt_name
    from mteb.types import PromptType

    class CachedEncoder(SentenceTransformerEncoderWrapper):
        """mteb's Sentence-Transformers wrapper encoding through medadapt's embedding cache, keyed by role and
        the prompt mteb resolves (mteb's own cache wrappers key by text only)."""

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


def _expanded(meta, tasks: set[str] | None, adapted_from: str | None = None) -> set[str]:
    """``tasks`` as mteb reads training data (``ModelMeta.get_training_datasets``: related tasks, and with
    ``adapted_from`` what mteb's model registry lists for that model)."""
    return meta.model_copy(update={"training_datasets": set(tasks or ()), "adapted_from": adapted_from}) \
        .get_training_datasets() or set()


def leak_message(meta, task, provenance: Provenance | None = None) -> str | None:
    """A line saying that ``task`` is in the training data of the model ``meta`` describes (mteb's own test,
    ``ModelMeta.is_zero_shot_on``) and why, or ``None``."""
    if meta.is_zero_shot_on([task]) is not False:
        return None
    name = task.metadata.name
    given = [data for data, tasks in ((provenance.training_data if provenance else None) or {}).items()
             if tasks and name in _expanded(meta, set(tasks))]
    if given:
        why = f"the run trained on {', '.join(given)}"
    elif name in _expanded(meta, meta.training_datasets):
        why = "its training_datasets list it, or a task mteb derives it from"
    else:
        why = f"its base model {meta.adapted_from} was trained on it, per mteb's model registry"
    return (f"MTEB task {name} is in the training data of {meta.name} ({why}): its score is not zero-shot "
            "(model_meta.json's training_datasets says so)")


def run_mteb(model, task, *, output: str | Path | None = None, name: str | None = None,
             revision: str | None = None, use_cache: bool = False, cache=None, batch_size: int = 64,
             overwrite: bool = True, show_progress: bool = False, source: str | Path | None = None,
             provenance: Provenance | None = None) -> dict[str, Any]:
    """Evaluate ``model`` (a SentenceTransformer, or an encoder from :func:`mteb_model`) on ``task`` (an mteb
    task, or a loaded medadapt retrieval task) with ``mteb.evaluate``; a leak (:func:`leak_message`) is one
    warning first. ``output``: mteb's result cache folder (``results/<model>/<revision>/<task>.json``,
    ``model_meta.json``, and :data:`PROVENANCE_FILE`); ``overwrite=False`` returns a cached result.

    Returns ``{"task", "model", "revision", "seconds", "scores": {split: {subset: scores}}, "main_score",
    "medadapt": {metric: value} (first split and subset), "zero_shot", "provenance"}``.
    """
    mteb = require_mteb()
    from sentence_transformers import SentenceTransformer

    if isinstance(task, EvalTask):
        task = mteb_task_of(task)
    wrapped = mteb_model(model, name=name, revision=revision, use_cache=use_cache, cache=cache,
                         batch_size=batch_size, source=source, provenance=provenance) \
        if isinstance(model, SentenceTransformer) else model
    prov = getattr(wrapped, "medadapt_provenance", None) or provenance
    meta = wrapped.mteb_model_meta
    leak = leak_message(meta, task, prov)
    if leak is not None:
        warn(leak)
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
    result = {"task": task.metadata.name, "model": meta.name, "revision": meta.revision, "seconds": seconds,
              "scores": scores, "main_score": first.get("main_score"), "medadapt": medadapt_scores(first),
              "zero_shot": meta.is_zero_shot_on([task]), "provenance": prov.to_dict() if prov else None}
    if output is not None and prov is not None:
        text = ("# Where medadapt read the provenance in model_meta.json (adapted_from, training_datasets); the\n"
                "# training data by its recipe's names, local data that is no MTEB task included.\n"
                + yaml.safe_dump(prov.to_dict(), sort_keys=False, allow_unicode=True))
        atomic_write_text(result_path(output, result).parent / PROVENANCE_FILE, text)
    return result


def result_path(output: str | Path, result: dict[str, Any]) -> Path:
    """Where :func:`run_mteb` with ``output`` wrote ``result`` (mteb's ``ResultCache`` layout)."""
    mteb = require_mteb()
    return mteb.ResultCache(cache_path=str(output)).get_task_result_path(
        task_name=result["task"], model_name=result["model"].replace("/", "__").replace(" ", "_"),
        model_revision=result["revision"])


def _check_agreement(ours: dict[str, float], theirs: dict[str, float], tolerance: float = 0.002) -> None:
    """Warn when mteb's and medadapt's figures for the same metric differ by more than ``tolerance``."""
    for metric, value in ours.items():
        other = theirs.get(metric)
        if other is not None and abs(other - value) > tolerance:
            warn(f"mteb gives {metric} {other:.5f}, medadapt {value:.5f} (difference above {tolerance}); "
                 "check the data for repeated ids and the model's prompts")


def _cli_run(model, task, output, cache, batch_size: int, quiet: bool, console, source) -> dict[str, Any]:
    """:func:`run_mteb` for the CLI, through medadapt's cache: first a ``note:`` line when mteb scores only
    the dense side of a model with a learned-lexical side; mteb's own bars only with ``--verbose``."""
    encoder = sparse_encoder(model)
    if encoder is not None and console is not None:
        name = Path(str(source)).name if source is not None else "the model"
        console.print(f"note: {name} is a hybrid model ({encoder.encoder_tag}: dense + learned-lexical); mteb "
                      "scores its dense side, the model medadapt.load gives (medadapt eval --mode hybrid scores "
                      "both)", highlight=False, soft_wrap=True)
    return run_mteb(model, task, output=output, use_cache=True, cache=cache, batch_size=batch_size,
                    show_progress=not quiet and level() == "verbose", source=source)


def mteb_task_of(task: EvalTask | BeirDataset, split: str | None = None):
    """The mteb task of a loaded medadapt retrieval task or BEIR split (the same corpus, queries and qrels)."""
    if isinstance(task, EvalTask):
        if task.kind != "retrieval" or task.data is None:
            raise MedAdaptError(f"the mteb export takes a loaded retrieval task, not {task!r}")
        return local_retrieval_task(task.dataset, task.split)
    return local_retrieval_task(task, split or "test")


def cli_write_mteb(model, task: EvalTask | BeirDataset, split: str, results: dict[str, float],
                   output: str | Path, cache, batch_size: int = 64, quiet: bool = False, console=None,
                   source: str | Path | None = None) -> dict[str, Any]:
    """``medadapt eval ... --mteb-output DIR``: mteb scores ``model`` on the task ``results`` came from and
    writes its result files under ``DIR``; a figure more than 0.002 off ``results`` is a warning."""
    task = mteb_task_of(task, split)
    result = _cli_run(model, task, output, cache, batch_size, quiet, console, source)
    _check_agreement(results, result["medadapt"])
    if console is not None:
        console.print(f"mteb {task.metadata.name} ({result['model']} @ {result['revision']}): main score "
                      f"{result['main_score']:.5f}; wrote {result_path(output, result)}")
    return result


def cli_mteb_task(name: str, model: str, data: str | None, split: str, output: str | Path | None,
                  mteb_output: str | Path | None, *, cache, device=None, batch_size: int = 64,
                  quiet: bool = False, console=None) -> dict[str, Any]:
    """``medadapt eval --mteb-task NAME``: the registered MTEB task on local data (``--data`` left at
    ``medmini``: mteb's own loader, offline) for any model :func:`medadapt.load` reads; a table of its scores,
    ``--output`` as flat JSON, ``--mteb-output`` for mteb's result files."""
    task = named_task(name, None if data in (None, "medmini") else data, split)
    result = _cli_run(load(model, device=device), task, mteb_output, cache, batch_size, quiet, console, model)
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
