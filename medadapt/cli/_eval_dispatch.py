"""What ``medadapt eval`` runs for its options: checks first (before any data or model is read), then one
evaluation: a paired comparison, an MTEB task, a suite, a retrieval evaluation of a model, a HyReC folder
or an index folder (dense, lexical or hybrid), or one of the other task kinds (file formats:
docs/evaluation.md)."""

from __future__ import annotations

import enum
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from medadapt.cache import EmbeddingCache
from medadapt.cli._common import check_backend_option, console
from medadapt.data import builtin_names, check_split, load_beir, load_rerank, load_sts, resolve_data_dir
from medadapt.data.text import check_text
from medadapt.encode import launch_state, launched_processes, process_device, share_encoding
from medadapt.errors import DataError, MedAdaptError, warn
from medadapt.eval import (
    DEFAULT_METRICS,
    ENTITY_LINKING_METRICS,
    QA_METRICS,
    RERANK_METRICS,
    evaluate_pool,
    evaluate_recommendation,
    evaluate_rerank,
    evaluate_retrieval,
    evaluate_run,
    evaluate_sts,
    load_pool_task,
    load_recommendation,
    parse_metric,
    plot_results,
    results_table,
    write_json,
)
from medadapt.eval.compare import cli_compare
from medadapt.eval.mteb import cli_mteb_task, cli_write_mteb
from medadapt.eval.suites import get_suite, load_suite, plot_suite, run_suite, suite_table, write_suite_json
from medadapt.hyrec.evaluate import evaluate_hyrec
from medadapt.hyrec.model import HyReCModel
from medadapt.io import check_outputs
from medadapt.models import check_device, load
from medadapt.retrieval.config import RetrieverConfig
from medadapt.retrieval.docstore import Documents
from medadapt.retrieval.retriever import Retriever

DEFAULT_MODEL = "minilm"


class Mode(str, enum.Enum):
    """Which side of a model or index retrieval uses."""

    dense = "dense"
    lexical = "lexical"
    hybrid = "hybrid"


class StsSimilarity(str, enum.Enum):
    cosine = "cosine"
    dot = "dot"
    model = "model"


class Instructions(str, enum.Enum):
    """Suites: the papers' task instructions for every model, none, or only an instruction-aware one."""

    auto = "auto"
    on = "on"
    off = "off"


class Route(str, enum.Enum):
    query = "query"
    document = "document"


class Task(str, enum.Enum):
    retrieval = "retrieval"
    rerank = "rerank"
    sts = "sts"
    qa = "qa"
    entity_linking = "entity-linking"
    recommendation = "recommendation"


@dataclass(frozen=True)
class EvalOptions:
    """The options of ``medadapt eval``, as given (``model`` is ``None`` when not given)."""

    model: str | None
    data: str
    split: str
    task: Task
    metrics: str | None
    output: Path | None
    plot: Path | None
    batch_size: int
    device: str | None
    cache_dir: Path | None
    no_cache: bool
    quiet: bool
    mode: Mode | None
    query_prompt: str | None
    similarity: StsSimilarity
    route: Route | None
    suite: str | None
    data_dir: Path | None
    suite_tasks: str | None
    instructions: Instructions | None
    no_instructions: bool
    mteb_output: Path | None
    mteb_task: str | None
    compare: tuple[str, str] | None
    backend: str
    index: Path | None

    @property
    def model_name(self) -> str:
        return self.model or DEFAULT_MODEL

    @property
    def uses_suite(self) -> bool:
        return self.suite is not None or self.data_dir is not None


def hyrec_dir(model: str | None) -> Path | None:
    """The model folder when it holds a HyReC lexical branch (``hyrec/config.json``), else ``None``."""
    path = Path(model) if model else None
    return path if path is not None and (path / "hyrec" / "config.json").is_file() else None


@contextmanager
def cache_for(cache_dir: Path | None, no_cache: bool):
    """The embedding cache of a run: ``cache_dir`` (default root), or a temporary one with ``--no-cache``."""
    if not no_cache:
        yield EmbeddingCache(cache_dir)
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield EmbeddingCache(tmp)


def run_eval(o: EvalOptions) -> None:
    """Check ``o`` and run the one evaluation it asks for."""
    check_options(o)
    if o.compare is not None:
        cli_compare(o.compare, o.data, o.split, o.metrics, o.output, device=o.device, cache_dir=o.cache_dir,
                    no_cache=o.no_cache, batch_size=o.batch_size, quiet=o.quiet, console=console)
        return
    if o.mteb_task is not None:
        cli_mteb_task(o.mteb_task, o.model_name, o.data, o.split, o.output, o.mteb_output, device=o.device,
                      cache_dir=o.cache_dir, no_cache=o.no_cache, batch_size=o.batch_size, quiet=o.quiet,
                      console=console)
        return
    if o.mteb_output is not None and o.task is not Task.retrieval:
        raise MedAdaptError("--mteb-output applies to --task retrieval (or --mteb-task NAME)")
    if o.uses_suite:
        if o.task is not Task.retrieval or o.mteb_output is not None:
            raise MedAdaptError("--task and --mteb-output do not apply to --suite (each suite fixes its tasks)")
        eval_suite(o)
        return
    metrics = parse_metrics(o.metrics)
    if o.task is Task.retrieval:
        eval_retrieval(o, metrics)
    else:
        eval_task(o, metrics)


def check_options(o: EvalOptions) -> None:
    """Every check that needs neither data nor a model (one :class:`MedAdaptError` at the first failure)."""
    check_device(o.device)  # before reading data or loading a model
    if o.query_prompt is not None:
        check_text(o.query_prompt, "--query-prompt")
    check_backend_option(o.backend, **{"--compare": o.compare is not None, "--mteb-task": o.mteb_task is not None,
                                       "--suite": o.uses_suite, "a HyReC model": hyrec_dir(o.model) is not None,
                                       "--index": o.index is not None})
    check_outputs({"--output": o.output, "--plot": o.plot})  # each a file, and not the same one
    if (o.instructions is not None or o.no_instructions) and not o.uses_suite:
        raise MedAdaptError("--instructions / --no-instructions apply to --suite only")
    if o.no_instructions and o.instructions not in (None, Instructions.off):
        raise MedAdaptError(f"--no-instructions contradicts --instructions {o.instructions.value}: give one")
    if launched_processes() > 1:  # `accelerate launch`: only a dense retrieval evaluation shares its encode
        alone = {"--compare": o.compare is not None, "--mteb-task": o.mteb_task is not None,
                 "--suite": o.uses_suite, "--no-cache": o.no_cache, "a HyReC model": hyrec_dir(o.model) is not None,
                 "--index": o.index is not None, f"--mode {o.mode.value if o.mode else ''}": o.mode is Mode.hybrid,
                 f"--task {o.task.value}": o.task is not Task.retrieval}
        if any(alone.values()):
            raise MedAdaptError("under `accelerate launch` eval shares the corpus encode of a dense retrieval "
                                "evaluation through the embedding cache; "
                                f"{', '.join(k for k, on in alone.items() if on)}: run without accelerate launch")
    if o.mteb_output is not None and o.mteb_output.exists() and not o.mteb_output.is_dir():
        raise MedAdaptError(f"--mteb-output {o.mteb_output} is a file; give a folder")
    if o.index is not None:
        for flag, used in (("--compare", o.compare is not None), ("--mteb-task", o.mteb_task is not None),
                           ("--suite", o.uses_suite), ("--mteb-output", o.mteb_output is not None),
                           ("--query-prompt", o.query_prompt is not None),
                           (f"--task {o.task.value}", o.task is not Task.retrieval)):
            if used:
                raise MedAdaptError(f"--index evaluates retrieval with the index's own documents and query model; "
                                    f"{flag} does not apply to it")


def parse_metrics(metrics: str | None) -> list[str] | None:
    """``--metrics`` as a list (``None`` when not given); an unknown metric is a :class:`MedAdaptError`."""
    metric_list = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
    for m in metric_list or ():
        try:
            parse_metric(m)
        except ValueError as exc:
            raise MedAdaptError(str(exc)) from None
    return metric_list


def task_file(data: str, task: Task, split: str) -> Path:
    """Locate the JSONL of a non-retrieval task: the path itself, or ``<dir>/<task>/<split>.jsonl``, or
    ``<dir>/<task>.jsonl``."""
    check_split(split)
    path = resolve_data_dir(data)
    if path.is_file():
        return path
    if not path.exists():
        raise DataError(f"data not found: {data} is neither a file, a folder nor a builtin dataset "
                        f"({', '.join(builtin_names())})")
    for candidate in (path / task.value / f"{split}.jsonl", path / f"{task.value}.jsonl"):
        if candidate.is_file():
            return candidate
    raise DataError(f"no {task.value} file in {path} (looked for {task.value}/{split}.jsonl and {task.value}.jsonl)")


# ------------------------------------------------------------------------------------------- retrieval
def supported_modes(o: EvalOptions, index_kind: str | None = None) -> tuple[Mode, ...]:
    """The ``--mode`` values the evaluated input offers: every side of a HyReC folder or of a hybrid index,
    an index's own kind, and dense or hybrid (dense + BM25 over the corpus) for a dense model."""
    if index_kind is not None:
        return tuple(Mode) if index_kind == Mode.hybrid.value else (Mode(index_kind),)
    if hyrec_dir(o.model) is not None:
        return tuple(Mode)
    return Mode.dense, Mode.hybrid


def check_mode(o: EvalOptions, index_kind: str | None = None) -> Mode:
    """``--mode`` (or the input's default: an index's kind, HyReC's hybrid, a model's dense) if the input
    supports it; otherwise one error naming the modes it does support."""
    modes = supported_modes(o, index_kind)
    if o.mode is None:
        return Mode(index_kind) if index_kind else Mode.hybrid if hyrec_dir(o.model) else Mode.dense
    if o.mode in modes:
        return o.mode
    names = " or ".join(m.value for m in modes)
    if index_kind is not None:
        what = f"index {o.index} ({index_kind}) supports --mode {names}"
    else:
        what = (f"{o.model_name} is a dense model: it supports --mode {names} (dense + BM25); --mode lexical "
                "needs a HyReC model folder (with hyrec/config.json) or a lexical or hybrid --index")
    raise MedAdaptError(f"--mode {o.mode.value}: {what}")


def eval_retrieval(o: EvalOptions, metrics: list[str] | None) -> None:
    """Retrieval metrics of an index folder, a HyReC folder or a model on ``--data`` / ``--split``."""
    dataset = load_beir(o.data, [o.split])  # validate data before loading a model
    if o.index is not None:
        eval_index(o, dataset, metrics or list(DEFAULT_METRICS))
        return
    mode = check_mode(o)
    folder = hyrec_dir(o.model)
    t0 = time.perf_counter()
    if folder is not None:
        eval_hyrec(o, folder, dataset, mode, metrics or DEFAULT_METRICS, t0)
    elif mode is Mode.hybrid:
        results = hybrid_model_metrics(o, dataset, metrics or list(DEFAULT_METRICS))
        report(results, o.model_name, o, time.perf_counter() - t0)
    else:
        eval_dense(o, dataset, metrics or DEFAULT_METRICS, t0)


def eval_dense(o: EvalOptions, dataset, metrics, t0: float) -> None:
    """A sentence-transformers model's dense retrieval (its corpus encode shared under ``accelerate
    launch``), with ``--mteb-output`` also through the mteb package."""
    device, state = o.device, None
    if launched_processes() > 1:  # under `accelerate launch`: the processes share the corpus encode
        state = launch_state(device)
        device = process_device(state, device)
    st_model = load_model(o, device)
    with cache_for(o.cache_dir, o.no_cache) as cache:
        if state is not None:
            share_encoding(st_model, dataset.doc_texts(), cache=cache, batch_size=o.batch_size,
                           show_progress=not o.quiet, state=state)
            if not state.is_main_process:  # the main process evaluates from the filled cache
                return
        results = evaluate_retrieval(st_model, dataset, o.split, metrics, cache=cache, batch_size=o.batch_size,
                                     show_progress=not o.quiet)
        report(results, o.model_name, o, time.perf_counter() - t0)
        if o.mteb_output is not None:
            cli_write_mteb(st_model, dataset, o.split, results, o.mteb_output, cache, o.batch_size, o.quiet,
                           console, source=o.model_name)


def eval_hyrec(o: EvalOptions, folder: Path, dataset, mode: Mode, metrics, t0: float) -> None:
    """A saved HyReC model (:func:`medadapt.hyrec.evaluate.evaluate_hyrec`): the lexical side through the
    inverted index, the dense side through FAISS, hybrid as the normalised sum."""
    if o.mteb_output is not None and mode is not Mode.dense:
        raise MedAdaptError("--mteb-output evaluates the dense side of a HyReC model: add --mode dense")
    config = HyReCModel.read_config(folder)  # hyrec/SHA256SUMS checked first (a ModelLoadError otherwise)
    # a dense side saved with its own token limit is the plain sentence-transformers model: cacheable
    dense_source = "cache" if config.dense_max_length and not o.no_cache else "model"
    with cache_for(o.cache_dir, o.no_cache) as cache:
        results = evaluate_hyrec(folder, dataset, o.split, mode.value, metrics, cache=cache,
                                 dense_source=dense_source, batch_size=o.batch_size, show_progress=not o.quiet,
                                 device=o.device)
    report(results, o.model_name, o, time.perf_counter() - t0)
    if o.mteb_output is not None:
        with cache_for(o.cache_dir, o.no_cache) as cache:
            cli_write_mteb(load(str(folder), device=o.device), dataset, o.split, results, o.mteb_output, cache,
                           o.batch_size, o.quiet, console, source=str(folder))


def hybrid_model_metrics(o: EvalOptions, dataset, metrics: list[str]) -> dict:
    """Dense + BM25 over ``dataset``'s corpus, fused as a hybrid :class:`~medadapt.retrieval.Retriever`
    built in memory (min-max fusion, equal weights: what ``medadapt index --kind hybrid`` builds)."""
    if o.mteb_output is not None:
        raise MedAdaptError("--mteb-output evaluates a dense model: use --mode dense")
    docs = Documents(dataset.doc_ids, [d["text"] for d in dataset.corpus.values()],
                     [d["title"] for d in dataset.corpus.values()])
    st_model = load_model(o, o.device)
    with cache_for(o.cache_dir, o.no_cache) as cache:
        retriever = Retriever.build(docs, st_model, config=RetrieverConfig(kind="hybrid", batch_size=o.batch_size),
                                    cache=cache, model_name=o.model_name, show_progress=not o.quiet)
        return retriever_metrics(retriever, dataset, o.split, metrics)


def eval_index(o: EvalOptions, dataset, metrics: list[str]) -> None:
    """A saved index folder (``medadapt index``) searched with its own model (or ``--model``, checked
    against it) for the split's queries; ``--mode`` picks one side of a hybrid index."""
    t0 = time.perf_counter()
    retriever = Retriever.load(o.index, model=o.model, device=o.device)
    mode = check_mode(o, retriever.kind)
    if mode.value != retriever.kind:  # one side of a hybrid index
        config = RetrieverConfig(**{**retriever.config.model_dump(), "kind": mode.value})
        retriever = Retriever(config, retriever.ids, retriever.docstore, retriever.encoder,
                              retriever.dense if config.uses_dense else None,
                              retriever.lexical if config.uses_lexical else None, retriever.manifest)
    docs = Documents(dataset.doc_ids, [d["text"] for d in dataset.corpus.values()],
                     [d["title"] for d in dataset.corpus.values()])
    if retriever.manifest is not None and retriever.manifest.corpus_hash != docs.content_hash():
        warn(f"index {o.index} holds another corpus than {o.data}: documents it lacks count as not retrieved")
    results = retriever_metrics(retriever, dataset, o.split, metrics)
    report(results, o.index.name or str(o.index), o, time.perf_counter() - t0)


def retriever_metrics(retriever: Retriever, dataset, split: str, metrics: list[str]) -> dict:
    """The metrics of ``retriever``'s top-``depth`` for the split's queries (depth: the largest cut-off of
    ``metrics``, at least 100, as the dense evaluation)."""
    depth = max([parse_metric(m)[1] for m in metrics] + [100])
    queries = dataset.split_queries(split)
    qids = list(queries)
    results = retriever.batch_search([queries[q] for q in qids], depth)
    run = {qid: {hit.id: hit.score for hit in res} for qid, res in zip(qids, results)}
    return evaluate_run(dataset.qrels[split], run, metrics)


# ------------------------------------------------------------------------------------------- other tasks
def eval_task(o: EvalOptions, metrics: list[str] | None) -> None:
    """Rerank, STS, QA, entity linking or paper recommendation on a task file."""
    items = load_task_items(o, metrics)
    if o.mode is not None:
        raise MedAdaptError(f"--mode {o.mode.value} applies to --task retrieval")
    t0 = time.perf_counter()
    st_model = load_model(o, o.device)
    show = not o.quiet
    if o.task in (Task.qa, Task.entity_linking):
        defaults = QA_METRICS if o.task is Task.qa else ENTITY_LINKING_METRICS  # BMRetriever §4
        results = evaluate_pool(st_model, items, metrics or defaults, o.batch_size, show)
    elif o.task is Task.recommendation:
        results = evaluate_recommendation(st_model, items, o.batch_size, show)
    elif o.task is Task.rerank:
        results = evaluate_rerank(st_model, items, metrics or RERANK_METRICS, o.batch_size, show)
    else:
        if metrics:
            raise MedAdaptError("--metrics does not apply to STS (it reports pearson and spearman)")
        try:
            results = evaluate_sts(st_model, items, o.batch_size, show, similarity=o.similarity.value,
                                   route=o.route.value if o.route else None)
        except ValueError as exc:
            raise MedAdaptError(str(exc)) from None
    report(results, o.model_name, o, time.perf_counter() - t0)


def load_task_items(o: EvalOptions, metrics: list[str] | None):
    """The task file's items, read (and checked) before a model is loaded."""
    if o.task in (Task.qa, Task.entity_linking):
        return load_pool_task(task_file(o.data, o.task, o.split))
    if o.task is Task.recommendation:
        if metrics:
            raise MedAdaptError("--metrics does not apply to recommendation (it reports map and ndcg)")
        return load_recommendation(task_file(o.data, o.task, o.split))
    path = task_file(o.data, o.task, o.split)
    return load_rerank(path) if o.task is Task.rerank else load_sts(path)


def load_model(o: EvalOptions, device: str | None):
    """The model on ``--backend``, with ``--query-prompt`` set as its ``query`` prompt (for STS, a
    symmetric task, both sentences get it: BIOSSES, Table 10)."""
    st_model = load(o.model_name, device=device, backend=o.backend)
    if o.query_prompt is not None:
        st_model.prompts = {**(st_model.prompts or {}), "query": o.query_prompt.replace("\\n", "\n")}
        if o.task is Task.sts:
            st_model.default_prompt_name = "query"
    return st_model


# ------------------------------------------------------------------------------------------- suites, report
def eval_suite(o: EvalOptions) -> None:
    """``--suite NAME --data-dir DIR``: every task of the suite (files checked before the model loads), the
    per-task table and the paper's averages (:mod:`medadapt.eval.suites`)."""
    if o.suite is None or o.data_dir is None:
        raise MedAdaptError("--suite and --data-dir go together (e.g. --suite cure --data-dir data/cure)")
    for flag, value in (("--metrics", o.metrics), ("--mode", o.mode), ("--query-prompt", o.query_prompt)):
        if value is not None:
            raise MedAdaptError(f"{flag} does not apply to --suite (each task uses its paper's metrics and "
                                "instruction; --instructions off keeps the model's own prompts)")
    spec = get_suite(o.suite)
    tasks = [t.strip() for t in o.suite_tasks.split(",") if t.strip()] if o.suite_tasks else None
    loaded = load_suite(spec, o.data_dir, o.split, tasks)
    st_model = load(o.model_name, device=o.device)
    instructions = "off" if o.no_instructions else (o.instructions or Instructions.auto).value
    t0 = time.perf_counter()
    with cache_for(o.cache_dir, o.no_cache) as cache:
        result = run_suite(spec, st_model, loaded, o.split, cache=cache, batch_size=o.batch_size,
                           show_progress=not o.quiet, instructions=instructions,
                           model_name=Path(o.model_name).name or o.model_name)
    console.print(suite_table(result, title=f"{result.title}: {result.model} on {o.data_dir}/{o.split} "
                                            f"({time.perf_counter() - t0:.1f} s)"))
    if o.output:
        write_suite_json(o.output, result)
        console.print(f"wrote {o.output}")
    if o.plot:
        plot_suite(result, o.plot)
        console.print(f"wrote {o.plot}")


def report(results: dict, name: str, o: EvalOptions, seconds: float) -> None:
    """The results table, and the JSON / plot files asked for."""
    label = Path(name).name or name
    console.print(results_table({f"{label} on {Path(o.data).name or o.data}/{o.split}": results},
                                o.task.value, title=f"medadapt eval ({seconds:.1f} s)"))
    if o.output:
        write_json(o.output, results)
        console.print(f"wrote {o.output}")
    if o.plot:
        plot_results({label: results}, o.plot, title=f"{o.task.value}: {o.data}/{o.split}")
        console.print(f"wrote {o.plot}")
