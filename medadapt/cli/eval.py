"""``medadapt eval``: retrieval, rerank, STS, and BMRetriever's QA / entity-linking / paper-recommendation
tasks from the command line (file formats: docs/evaluation.md)."""

from __future__ import annotations

import enum
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from medadapt.cli._common import console, fail, quiet_libraries
from medadapt.errors import DataError, MedAdaptError


class Mode(str, enum.Enum):
    """Which side of a HyReC model (dense + lexical branch) retrieval uses."""

    dense = "dense"
    lexical = "lexical"
    hybrid = "hybrid"


def _hyrec_dir(model: str) -> Path | None:
    """The model folder when it holds a HyReC lexical branch (``hyrec/config.json``), else ``None``."""
    path = Path(model)
    return path if (path / "hyrec" / "config.json").is_file() else None


class StsSimilarity(str, enum.Enum):
    cosine = "cosine"
    dot = "dot"
    model = "model"


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


#: Default metrics of the pool-ranking tasks (BMRetriever §4).
def _pool_defaults(task: Task) -> tuple[str, ...]:
    from medadapt.eval import ENTITY_LINKING_METRICS, QA_METRICS

    return QA_METRICS if task is Task.qa else ENTITY_LINKING_METRICS


def check_output_file(path: Path | None, option: str = "--output") -> None:
    """Refuse, before any work, an output path that is a folder or that cannot be created (the write itself
    is atomic and refuses these too, but only after the evaluation)."""
    import os

    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise MedAdaptError(f"{option} {path} is an existing folder; give a file path")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise MedAdaptError(f"cannot write {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MedAdaptError(f"cannot write {path}: no write permission in {parent}")


def _task_file(data: str, task: Task, split: str) -> Path:
    """Locate the JSONL for rerank / STS: the path itself, or ``<dir>/<task>.jsonl``, or
    ``<dir>/<task>/<split>.jsonl``."""
    from medadapt.data import resolve_data_dir

    path = resolve_data_dir(data)
    if path.is_file():
        return path
    for candidate in (path / task.value / f"{split}.jsonl", path / f"{task.value}.jsonl"):
        if candidate.is_file():
            return candidate
    raise DataError(f"no {task.value} file in {path} (looked for {task.value}/{split}.jsonl and {task.value}.jsonl)")


def eval_cmd(
    model: Annotated[str, typer.Option(help="Model alias (minilm), saved model folder, or hub id.")] = "minilm",
    data: Annotated[str, typer.Option(help="BEIR folder, task JSONL, or builtin dataset (medmini).")] = "medmini",
    split: Annotated[str, typer.Option(help="qrels split (retrieval) or file split.")] = "test",
    task: Annotated[Task, typer.Option(help="What to evaluate.")] = Task.retrieval,
    metrics: Annotated[
        Optional[str], typer.Option(help="Comma-separated metrics, e.g. ndcg@10,recall@100,f1@10.")
    ] = None,
    output: Annotated[Optional[Path], typer.Option(help="Write the metrics as JSON here.")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write a bar plot (PNG) of the metrics here.")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Encoding batch size.")] = 64,
    device: Annotated[Optional[str], typer.Option(help="cpu, cuda, mps ... (default: auto).")] = None,
    cache_dir: Annotated[
        Optional[Path], typer.Option(help="Embedding cache folder (default $MEDADAPT_CACHE or ~/.cache/medadapt).")
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Encode without reading or writing the cache.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
    mode: Annotated[
        Optional[Mode], typer.Option(help="HyReC models: lexical-only, dense-only or hybrid retrieval "
                                          "(default hybrid; other models are dense).")
    ] = None,
    query_prompt: Annotated[
        Optional[str], typer.Option(help="Instruction prepended to queries (sets the model's 'query' prompt), "
                                         "e.g. 'Given a question, retrieve ...\\nQuery: '.")
    ] = None,
    similarity: Annotated[
        StsSimilarity, typer.Option(help="STS: cosine (as the papers score STS), dot, or the model's own.")
    ] = StsSimilarity.cosine,
    route: Annotated[
        Optional[Route], typer.Option(help="STS on an asymmetric (CARE) model: the tower that encodes both "
                                           "sentences (default query).")
    ] = None,
) -> None:
    """Evaluate a model on retrieval (nDCG/Recall/MRR/MAP@k), rerank (MAP@10), STS (Pearson/Spearman), QA
    (Recall@5/20, nDCG@20), entity linking (Recall@1/5, MRR@5) or paper recommendation (MAP, nDCG)."""
    quiet_libraries()
    try:
        from medadapt.eval import DEFAULT_METRICS, RERANK_METRICS, parse_metric
        from medadapt.models import check_device

        check_device(device)  # before reading data or loading a model
        check_output_file(output)
        check_output_file(plot, "--plot")

        metric_list = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
        if metric_list:
            for m in metric_list:
                try:
                    parse_metric(m)
                except ValueError as exc:
                    raise MedAdaptError(str(exc)) from None
        if task is Task.retrieval:
            from medadapt.data import load_beir

            dataset = load_beir(data, [split])  # validate data before loading a model
        elif task in (Task.qa, Task.entity_linking):
            from medadapt.eval import load_pool_task

            items = load_pool_task(_task_file(data, task, split))
        elif task is Task.recommendation:
            from medadapt.eval import load_recommendation

            if metric_list:
                raise MedAdaptError("--metrics does not apply to recommendation (it reports map and ndcg)")
            items = load_recommendation(_task_file(data, task, split))
        else:
            task_path = _task_file(data, task, split)
            from medadapt.data import load_rerank, load_sts

            items = load_rerank(task_path) if task is Task.rerank else load_sts(task_path)

        hyrec_dir = _hyrec_dir(model)
        if mode is not None and (task is not Task.retrieval or (hyrec_dir is None and mode is not Mode.dense)):
            raise MedAdaptError(f"--mode {mode.value} needs --task retrieval and a HyReC model folder "
                                f"(with hyrec/config.json); {model} is not one")
        t0 = time.perf_counter()
        if hyrec_dir is not None and task is Task.retrieval:
            results = _eval_hyrec(hyrec_dir, dataset, split, mode or Mode.hybrid, metric_list or DEFAULT_METRICS,
                                  cache_dir, no_cache, batch_size, quiet)
            _report(results, model, data, split, task, output, plot, time.perf_counter() - t0)
            return
        from medadapt.models import load

        st_model = load(model, device=device)
        if query_prompt is not None:
            st_model.prompts = {**(st_model.prompts or {}), "query": query_prompt.replace("\\n", "\n")}
            if task is Task.sts:  # symmetric task: both sentences get the instruction (BIOSSES, Table 10)
                st_model.default_prompt_name = "query"
        if task is Task.retrieval:
            import tempfile

            from medadapt.cache import EmbeddingCache
            from medadapt.eval import evaluate_retrieval

            tmp = tempfile.TemporaryDirectory() if no_cache else None
            cache = EmbeddingCache(tmp.name if tmp else cache_dir)
            try:
                results = evaluate_retrieval(
                    st_model, dataset, split, metric_list or DEFAULT_METRICS, cache=cache,
                    batch_size=batch_size, show_progress=not quiet,
                )
            finally:
                if tmp:
                    tmp.cleanup()
        elif task in (Task.qa, Task.entity_linking):
            from medadapt.eval import evaluate_pool

            results = evaluate_pool(st_model, items, metric_list or _pool_defaults(task), batch_size, not quiet)
        elif task is Task.recommendation:
            from medadapt.eval import evaluate_recommendation

            results = evaluate_recommendation(st_model, items, batch_size, not quiet)
        elif task is Task.rerank:
            from medadapt.eval import evaluate_rerank

            results = evaluate_rerank(st_model, items, metric_list or RERANK_METRICS, batch_size, not quiet)
        else:
            from medadapt.eval import evaluate_sts

            if metric_list:
                raise MedAdaptError("--metrics does not apply to STS (it reports pearson and spearman)")
            try:
                results = evaluate_sts(st_model, items, batch_size, not quiet, similarity=similarity.value,
                                       route=route.value if route else None)
            except ValueError as exc:
                raise MedAdaptError(str(exc)) from None
        _report(results, model, data, split, task, output, plot, time.perf_counter() - t0)
    except MedAdaptError as exc:
        fail(str(exc))
    except OSError as exc:  # a file system error the steps above did not turn into a MedAdaptError
        fail(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
    except KeyboardInterrupt:
        fail("interrupted")


def _eval_hyrec(folder: Path, dataset, split: str, mode: Mode, metrics: list[str], cache_dir: Path | None,
                no_cache: bool, batch_size: int, quiet: bool) -> dict:
    """Retrieval metrics of a saved HyReC model (:func:`medadapt.hyrec.evaluate_hyrec`): the lexical side
    through the inverted index, the dense side through FAISS, hybrid as the normalised sum."""
    import json
    import tempfile

    from medadapt.cache import EmbeddingCache
    from medadapt.hyrec.evaluate import evaluate_hyrec

    config = json.loads((folder / "hyrec" / "config.json").read_text(encoding="utf-8"))
    # a dense side saved with its own token limit is the plain sentence-transformers model: cacheable
    dense_source = "cache" if config.get("dense_max_length") and not no_cache else "model"
    tmp = tempfile.TemporaryDirectory() if no_cache else None
    try:
        cache = EmbeddingCache(tmp.name if tmp else cache_dir)
        return evaluate_hyrec(folder, dataset, split, mode.value, metrics, cache=cache, dense_source=dense_source,
                              batch_size=batch_size, show_progress=not quiet)
    finally:
        if tmp:
            tmp.cleanup()


def _report(results: dict, model: str, data: str, split: str, task: Task, output: Path | None,
            plot: Path | None, seconds: float) -> None:
    from medadapt.eval import plot_results, results_table, write_json

    console.print(results_table({f"{Path(model).name or model} on {Path(data).name or data}/{split}": results},
                                task.value, title=f"medadapt eval ({seconds:.1f} s)"))
    if output:
        write_json(output, results)
        console.print(f"wrote {output}")
    if plot:
        plot_results({Path(model).name or model: results}, plot, title=f"{task.value}: {data}/{split}")
        console.print(f"wrote {plot}")
