"""``medadapt eval``: retrieval, rerank, STS, and BMRetriever's QA / entity-linking / paper-recommendation
tasks from the command line (file formats: docs/evaluation.md)."""

from __future__ import annotations

import enum
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from medadapt.cli._common import (BackendOption, QuietOpt, VerboseOpt, check_backend_option, closes_process_group, console,
                                  fail, quiet_libraries)
from medadapt.errors import DataError, MedAdaptError
from medadapt.io import check_outputs


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


#: Default metrics of the pool-ranking tasks (BMRetriever §4).
def _pool_defaults(task: Task) -> tuple[str, ...]:
    from medadapt.eval import ENTITY_LINKING_METRICS, QA_METRICS

    return QA_METRICS if task is Task.qa else ENTITY_LINKING_METRICS


def _task_file(data: str, task: Task, split: str) -> Path:
    """Locate the JSONL for rerank / STS: the path itself, or ``<dir>/<task>.jsonl``, or
    ``<dir>/<task>/<split>.jsonl``."""
    from medadapt.data import builtin_names, check_split, resolve_data_dir

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


@closes_process_group
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
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
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
    suite: Annotated[
        Optional[str], typer.Option(help="Run a benchmark suite: cmedteb, cure, bmretriever or medmoe (reads "
                                         "--data-dir; layouts in docs/evaluation.md).")
    ] = None,
    data_dir: Annotated[
        Optional[Path], typer.Option(help="The suite's data folder (one sub-folder or file per task).")
    ] = None,
    suite_tasks: Annotated[
        Optional[str], typer.Option(help="Comma-separated subset of the suite's tasks (default: all).")
    ] = None,
    instructions: Annotated[
        Optional[Instructions], typer.Option(help="Suites: the papers' task instructions as query prompts: auto "
                                                  "(default; only for a model whose saved query prompt is an "
                                                  "instruction prompt), on, or off (the model's own prompts).")
    ] = None,
    no_instructions: Annotated[
        bool, typer.Option("--no-instructions", help="Suites: same as --instructions off.")
    ] = False,
    mteb_output: Annotated[
        Optional[Path], typer.Option(help="Also evaluate with the mteb package itself (same embeddings, through "
                                          "the cache) and write its result files under this folder.")
    ] = None,
    mteb_task: Annotated[
        Optional[str], typer.Option(help="Run this registered MTEB task (e.g. NFCorpus) on local data: --data "
                                         "is a BEIR folder or a local copy of the task's dataset repository.")
    ] = None,
    compare: Annotated[
        Optional[tuple[str, str]], typer.Option(help="Paired comparison of two runs (TREC run / JSON run files "
                                                     "or models) on --data/--split: per-query nDCG@10 (or the first "
                                                     "--metrics), bootstrap CI, paired t-test.")
    ] = None,
    backend: BackendOption = "torch",
) -> None:
    """Evaluate a model on retrieval (nDCG/Recall/MRR/MAP@k), rerank (MAP@10), STS (Pearson/Spearman), QA
    (Recall@5/20, nDCG@20), entity linking (Recall@1/5, MRR@5) or paper recommendation (MAP, nDCG)."""
    quiet_libraries()
    try:
        from medadapt.eval import DEFAULT_METRICS, RERANK_METRICS, parse_metric
        from medadapt.models import check_device

        check_device(device)  # before reading data or loading a model
        if query_prompt is not None:
            from medadapt.data.text import check_text

            check_text(query_prompt, "--query-prompt")
        check_backend_option(backend, **{"--compare": compare is not None, "--mteb-task": mteb_task is not None,
                                         "--suite": suite is not None or data_dir is not None,
                                         "a HyReC model": _hyrec_dir(model) is not None})
        check_outputs({"--output": output, "--plot": plot})  # each a file, and not the same one
        if (instructions is not None or no_instructions) and suite is None and data_dir is None:
            raise MedAdaptError("--instructions / --no-instructions apply to --suite only")
        if no_instructions and instructions not in (None, Instructions.off):
            raise MedAdaptError(f"--no-instructions contradicts --instructions {instructions.value}: give one")
        from medadapt.encode import launched_processes

        if launched_processes() > 1:  # `accelerate launch`: only a dense retrieval evaluation shares its encode
            alone = {"--compare": compare is not None, "--mteb-task": mteb_task is not None,
                     "--suite": suite is not None or data_dir is not None, "--no-cache": no_cache,
                     "a HyReC model": _hyrec_dir(model) is not None,
                     f"--task {task.value}": task is not Task.retrieval}
            if any(alone.values()):
                raise MedAdaptError("under `accelerate launch` eval shares the corpus encode of a dense retrieval "
                                    "evaluation through the embedding cache; "
                                    f"{', '.join(k for k, on in alone.items() if on)}: run without accelerate launch")
        if mteb_output is not None and mteb_output.exists() and not mteb_output.is_dir():
            raise MedAdaptError(f"--mteb-output {mteb_output} is a file; give a folder")
        if compare is not None or mteb_task is not None:
            if compare is not None:
                from medadapt.eval.compare import cli_compare

                cli_compare(compare, data, split, metrics, output, device=device, cache_dir=cache_dir,
                            no_cache=no_cache, batch_size=batch_size, quiet=quiet, console=console)
            else:
                from medadapt.eval.mteb import cli_mteb_task

                cli_mteb_task(mteb_task, model, data, split, output, mteb_output, device=device,
                              cache_dir=cache_dir, no_cache=no_cache, batch_size=batch_size, quiet=quiet,
                              console=console)
            return
        if mteb_output is not None and task is not Task.retrieval:
            raise MedAdaptError("--mteb-output applies to --task retrieval (or --mteb-task NAME)")
        if suite is not None or data_dir is not None:
            if task is not Task.retrieval or mteb_output is not None:
                raise MedAdaptError("--task and --mteb-output do not apply to --suite (each suite fixes its tasks)")
            _run_suite(suite, data_dir, suite_tasks, model, split, output, plot, metrics, mode, query_prompt,
                       batch_size, device, cache_dir, no_cache, quiet,
                       "off" if no_instructions else (instructions or Instructions.auto).value)
            return

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
            if mteb_output is not None and (mode or Mode.hybrid) is not Mode.dense:
                raise MedAdaptError("--mteb-output evaluates the dense side of a HyReC model: add --mode dense")
            results = _eval_hyrec(hyrec_dir, dataset, split, mode or Mode.hybrid, metric_list or DEFAULT_METRICS,
                                  cache_dir, no_cache, batch_size, quiet, device)
            _report(results, model, data, split, task, output, plot, time.perf_counter() - t0)
            if mteb_output is not None:
                import tempfile

                from medadapt.cache import EmbeddingCache
                from medadapt.eval.mteb import cli_write_mteb
                from medadapt.models import load

                with tempfile.TemporaryDirectory() as tmp:
                    cli_write_mteb(load(str(hyrec_dir), device=device), dataset, split, results, mteb_output,
                                   EmbeddingCache(tmp if no_cache else cache_dir), batch_size, quiet, console,
                                   source=str(hyrec_dir))
            return
        from medadapt.encode import launch_state, launched_processes, process_device
        from medadapt.models import load

        state = None
        if launched_processes() > 1:  # under `accelerate launch`: the processes share the corpus encode
            state = launch_state(device)
            device = process_device(state, device)
        st_model = load(model, device=device, backend=backend)
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
            if state is not None:
                from medadapt.encode import share_encoding

                share_encoding(st_model, dataset.doc_texts(), cache=cache, batch_size=batch_size,
                               show_progress=not quiet, state=state)
                if not state.is_main_process:  # the main process evaluates from the filled cache
                    return
            try:
                results = evaluate_retrieval(
                    st_model, dataset, split, metric_list or DEFAULT_METRICS, cache=cache,
                    batch_size=batch_size, show_progress=not quiet,
                )
                if mteb_output is not None:
                    from medadapt.eval.mteb import cli_write_mteb

                    _report(results, model, data, split, task, output, plot, time.perf_counter() - t0)
                    cli_write_mteb(st_model, dataset, split, results, mteb_output, cache, batch_size, quiet, console,
                                   source=model)
                    return
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


def _run_suite(suite: str | None, data_dir: Path | None, suite_tasks: str | None, model: str, split: str,
               output: Path | None, plot: Path | None, metrics: str | None, mode, query_prompt: str | None,
               batch_size: int, device: str | None, cache_dir: Path | None, no_cache: bool, quiet: bool,
               instructions: str) -> None:
    """``--suite NAME --data-dir DIR``: every task of the suite (files checked before the model loads), the
    per-task table and the paper's averages (:mod:`medadapt.eval.suites`)."""
    import tempfile

    from medadapt.eval.suites import get_suite, load_suite, plot_suite, run_suite, suite_table, write_suite_json

    if suite is None or data_dir is None:
        raise MedAdaptError("--suite and --data-dir go together (e.g. --suite cure --data-dir data/cure)")
    for flag, value in (("--metrics", metrics), ("--mode", mode), ("--query-prompt", query_prompt)):
        if value is not None:
            raise MedAdaptError(f"{flag} does not apply to --suite (each task uses its paper's metrics and "
                                "instruction; --instructions off keeps the model's own prompts)")
    spec = get_suite(suite)
    tasks = [t.strip() for t in suite_tasks.split(",") if t.strip()] if suite_tasks else None
    loaded = load_suite(spec, data_dir, split, tasks)
    from medadapt.cache import EmbeddingCache
    from medadapt.models import load

    st_model = load(model, device=device)
    t0 = time.perf_counter()
    tmp = tempfile.TemporaryDirectory() if no_cache else None
    try:
        result = run_suite(spec, st_model, loaded, split, cache=EmbeddingCache(tmp.name if tmp else cache_dir),
                           batch_size=batch_size, show_progress=not quiet, instructions=instructions,
                           model_name=Path(model).name or model)
    finally:
        if tmp:
            tmp.cleanup()
    console.print(suite_table(result, title=f"{result.title}: {result.model} on {data_dir}/{split} "
                                            f"({time.perf_counter() - t0:.1f} s)"))
    if output:
        write_suite_json(output, result)
        console.print(f"wrote {output}")
    if plot:
        plot_suite(result, plot)
        console.print(f"wrote {plot}")


def _eval_hyrec(folder: Path, dataset, split: str, mode: Mode, metrics: list[str], cache_dir: Path | None,
                no_cache: bool, batch_size: int, quiet: bool, device: str | None = None) -> dict:
    """Retrieval metrics of a saved HyReC model (:func:`medadapt.hyrec.evaluate_hyrec`): the lexical side
    through the inverted index, the dense side through FAISS, hybrid as the normalised sum."""
    import tempfile

    from medadapt.cache import EmbeddingCache
    from medadapt.hyrec.evaluate import evaluate_hyrec
    from medadapt.hyrec.model import HyReCModel

    config = HyReCModel.read_config(folder)  # hyrec/SHA256SUMS checked first (a ModelLoadError otherwise)
    # a dense side saved with its own token limit is the plain sentence-transformers model: cacheable
    dense_source = "cache" if config.dense_max_length and not no_cache else "model"
    tmp = tempfile.TemporaryDirectory() if no_cache else None
    try:
        cache = EmbeddingCache(tmp.name if tmp else cache_dir)
        return evaluate_hyrec(folder, dataset, split, mode.value, metrics, cache=cache, dense_source=dense_source,
                              batch_size=batch_size, show_progress=not quiet, device=device)
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
