"""What ``medadapt eval`` runs for its options (:mod:`medadapt.cli.eval`): checks first (before any data or
model is read), then one evaluation: a paired comparison, an MTEB task, a suite, or one task of any kind
through :func:`medadapt.eval.tasks.evaluate` (any model or index, any mode it offers; formats:
docs/evaluation.md)."""

from __future__ import annotations

import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from medadapt.cache import EmbeddingCache
from medadapt.cli._common import (
    Instructions,
    Mode,
    Task,
    check_backend_option,
    console,
    quiet_libraries,
    rerank_options,
    user_errors,
)
from medadapt.data.text import check_text
from medadapt.encode import launch_state, launched_processes, process_device, share_encoding
from medadapt.errors import MedAdaptError, warn
from medadapt.eval import parse_metric, plot_results, results_table, write_json
from medadapt.eval.compare import cli_compare
from medadapt.eval.mteb import cli_mteb_task, cli_write_mteb
from medadapt.eval.suites import get_suite, load_suite, plot_suite, run_suite, suite_table, write_suite_json
from medadapt.eval.tasks import EvalTask, evaluate, task_kind
from medadapt.eval.tasks.retrieval import (
    corpus_documents,
    default_mode,
    sparse_encoder,
    supported_modes,
)
from medadapt.io import check_outputs
from medadapt.models import check_device, load
from medadapt.retrieval.encoders import offers_sparse
from medadapt.retrieval.late import MaxSimConfig
from medadapt.retrieval.retriever import Retriever
from medadapt.training.distributed import closes_process_group

DEFAULT_MODEL = "minilm"


class EvalOptions(SimpleNamespace):
    """The options of ``medadapt eval`` as given, one attribute per parameter of
    :func:`medadapt.cli.eval.eval_cmd` (``model`` is ``None`` when not given)."""

    @property
    def model_name(self) -> str:
        return self.model or DEFAULT_MODEL

    @property
    def uses_suite(self) -> bool:
        return self.suite is not None or self.data_dir is not None

    @property
    def rerank_config(self) -> MaxSimConfig | None:
        """``--rerank maxsim`` with ``--rerank-weight`` / ``--rerank-depth`` / ``--rerank-domain-weights`` (checked:
        one ConfigError)."""
        options = rerank_options(self.rerank, self.rerank_weight, self.rerank_depth, self.rerank_domain_weights)
        return None if options is None else MaxSimConfig.of(batch_size=self.batch_size, **options)


@contextmanager
def cache_for(cache_dir: Path | None, no_cache: bool):
    """The embedding cache of a run: ``cache_dir`` (default root), or a temporary one with ``--no-cache``."""
    if not no_cache:
        yield EmbeddingCache(cache_dir)
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield EmbeddingCache(tmp)


@closes_process_group
def run_eval(verbose: bool, **given) -> None:
    """``medadapt eval`` with its options as given (:mod:`medadapt.cli.eval`)."""
    quiet_libraries()
    with user_errors():
        evaluate_options(EvalOptions(**given))


def evaluate_options(o: EvalOptions) -> None:
    """Check ``o`` and run the one evaluation it asks for."""
    check_options(o)
    if o.compare is not None or o.mteb_task is not None:
        with cache_for(o.cache_dir, o.no_cache) as cache:
            if o.compare is not None:
                cli_compare(o.compare, o.data, o.split, o.metrics, o.output, cache=cache, device=o.device,
                            batch_size=o.batch_size, quiet=o.quiet, console=console,
                            mode=o.mode and o.mode.value)
            else:
                cli_mteb_task(o.mteb_task, o.model_name, o.data, o.split, o.output, o.mteb_output, cache=cache,
                              device=o.device, batch_size=o.batch_size, quiet=o.quiet, console=console)
        return
    if o.mteb_output is not None and o.task is not Task.retrieval:
        raise MedAdaptError("--mteb-output applies to --task retrieval (or --mteb-task NAME)")
    if o.uses_suite:
        if o.task is not Task.retrieval or o.mteb_output is not None:
            raise MedAdaptError("--task and --mteb-output do not apply to --suite (each suite fixes its tasks)")
        eval_suite(o)
        return
    eval_one(o)


def check_options(o: EvalOptions) -> None:
    """Every check that needs neither data nor a model (one :class:`MedAdaptError` at the first failure)."""
    check_device(o.device)  # before reading data or loading a model
    if o.query_prompt is not None:
        check_text(o.query_prompt, "--query-prompt")
    check_backend_option(o.backend, **{"--compare": o.compare is not None, "--mteb-task": o.mteb_task is not None,
                                       "--suite": o.uses_suite, "a HyReC model": offers_sparse(o.model_name),
                                       "--index": o.index is not None})
    check_outputs({"--output": o.output, "--plot": o.plot})  # each a file, and not the same one
    if (o.instructions is not None or o.no_instructions) and not o.uses_suite:
        raise MedAdaptError("--instructions / --no-instructions apply to --suite only")
    if o.no_instructions and o.instructions not in (None, Instructions.off):
        raise MedAdaptError(f"--no-instructions contradicts --instructions {o.instructions.value}: give one")
    if launched_processes() > 1:  # `accelerate launch`: only a dense retrieval evaluation shares its encode
        alone = {"--compare": o.compare is not None, "--mteb-task": o.mteb_task is not None,
                 "--suite": o.uses_suite, "--no-cache": o.no_cache, "a HyReC model": offers_sparse(o.model_name),
                 "--index": o.index is not None, f"--mode {o.mode.value if o.mode else ''}": o.mode is Mode.hybrid,
                 f"--task {o.task.value}": o.task is not Task.retrieval}
        if any(alone.values()):
            raise MedAdaptError("under `accelerate launch` eval shares the corpus encode of a dense retrieval "
                                "evaluation through the embedding cache; "
                                f"{', '.join(k for k, on in alone.items() if on)}: run without accelerate launch")
    if o.mteb_output is not None and o.mteb_output.exists() and not o.mteb_output.is_dir():
        raise MedAdaptError(f"--mteb-output {o.mteb_output} is a file; give a folder")
    check_rerank(o)
    if o.index is not None:
        for flag, used in (("--compare", o.compare is not None), ("--mteb-task", o.mteb_task is not None),
                           ("--suite", o.uses_suite), ("--mteb-output", o.mteb_output is not None),
                           ("--query-prompt", o.query_prompt is not None),
                           (f"--task {o.task.value}", o.task is not Task.retrieval)):
            if used:
                raise MedAdaptError(f"--index evaluates retrieval with the index's own documents and query model; "
                                    f"{flag} does not apply to it")


def check_rerank(o: EvalOptions) -> None:
    """``--rerank`` and its options: retrieval on one model or index only, values in range."""
    if o.rerank_config is None:  # also checks --rerank-weight / --rerank-depth without --rerank
        return
    for flag, used in (("--compare", o.compare is not None), ("--mteb-task", o.mteb_task is not None),
                       ("--suite", o.uses_suite), ("--mteb-output", o.mteb_output is not None),
                       (f"--task {o.task.value}", o.task is not Task.retrieval),
                       ("accelerate launch", launched_processes() > 1)):
        if used:
            raise MedAdaptError(f"--rerank applies to one retrieval evaluation; {flag} does not take it")


def parse_metrics(metrics: str | None) -> list[str] | None:
    """``--metrics`` as a list (``None`` when not given); an unknown metric is a :class:`MedAdaptError`."""
    metric_list = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
    for m in metric_list or ():
        try:
            parse_metric(m)
        except ValueError as exc:
            raise MedAdaptError(str(exc)) from None
    return metric_list


def open_task(o: EvalOptions, metrics: list[str] | None) -> EvalTask:
    """The task ``--task`` names, its data read and checked from ``--data`` / ``--split`` before a model loads."""
    kind = task_kind(o.task.value)
    if o.mode is not None and not kind.modes:
        raise MedAdaptError(f"--mode {o.mode.value} applies to --task retrieval")
    if metrics and kind.fixed_metrics:
        label = "STS" if o.task is Task.sts else o.task.value
        raise MedAdaptError(f"--metrics does not apply to {label} (it reports {kind.fixed_metrics})")
    return kind.create(Path(o.data).name or o.data).load_data(o.data, o.split)


def check_mode(o: EvalOptions, model) -> Mode:
    """``--mode`` (or the input's default) if the input supports it; else one error naming the modes it does."""
    modes = [Mode(m) for m in supported_modes(model)]
    mode = Mode(default_mode(model)) if o.mode is None else o.mode
    if mode not in modes:
        names = " or ".join(m.value for m in modes)
        if o.index is not None:
            what = f"index {o.index} ({model.kind}) supports --mode {names}"
        else:
            what = (f"{o.model_name} is a dense model: it supports --mode {names} (dense + BM25); --mode lexical "
                    "needs a model with a learned-lexical module (a HyReC or composed run) or a lexical or hybrid --index")
        raise MedAdaptError(f"--mode {mode.value}: {what}")
    if o.mteb_output is not None and mode is not Mode.dense:
        side = "the dense side of a HyReC model: add" if sparse_encoder(model) else "a dense model: use"
        raise MedAdaptError(f"--mteb-output evaluates {side} --mode dense")
    return mode


def eval_one(o: EvalOptions) -> None:
    """One task on ``--data`` / ``--split``: the corpus encode shared under ``accelerate launch``;
    ``--mteb-output`` through mteb too."""
    metrics = parse_metrics(o.metrics)
    task = open_task(o, metrics)
    t0 = time.perf_counter()
    device, state = o.device, None
    if launched_processes() > 1:  # under `accelerate launch`: the processes share the corpus encode
        state = launch_state(device)
        device = process_device(state, device)
    model = (Retriever.load(o.index, model=o.model, device=o.device) if o.index is not None  # its own model
             else load_model(o, device))
    mode = check_mode(o, model) if task.modes else None
    if o.index is not None:
        warn_other_corpus(o, model, task)
    with cache_for(o.cache_dir, o.no_cache) as cache:
        if state is not None:
            share_encoding(model, task.dataset.doc_texts(), cache=cache, batch_size=o.batch_size,
                           show_progress=not o.quiet, state=state)
            if not state.is_main_process:  # the main process evaluates from the filled cache
                return
        result = evaluate(model, task, metrics=metrics, mode=mode and mode.value, cache=cache,
                          batch_size=o.batch_size, show_progress=not o.quiet, reuse_cache=not o.no_cache,
                          similarity=o.similarity.value, route=o.route and o.route.value,
                          rerank=o.rerank_config)
        name = (o.index.name or str(o.index)) if o.index is not None else o.model_name
        if o.rerank is not None:
            name = f"{Path(name).name or name} + {o.rerank.value}"
        report(result.metrics, name, o, time.perf_counter() - t0)
        if o.mteb_output is not None:
            cli_write_mteb(model, task, o.split, result.metrics, o.mteb_output, cache, o.batch_size, o.quiet,
                           console, source=o.model_name)


def warn_other_corpus(o: EvalOptions, retriever: Retriever, task: EvalTask) -> None:
    """A warning when the index holds another corpus than ``--data`` (documents it lacks are not retrieved)."""
    manifest = retriever.manifest
    if manifest is not None and manifest.corpus_hash != corpus_documents(task.dataset).content_hash():
        warn(f"index {o.index} holds another corpus than {o.data}: documents it lacks count as not retrieved")


def load_model(o: EvalOptions, device: str | None):
    """The model on ``--backend`` with ``--query-prompt`` as its ``query`` prompt (STS: on both sentences)."""
    st_model = load(o.model_name, device=device, backend=o.backend)
    if o.query_prompt is not None:
        st_model.prompts = {**(st_model.prompts or {}), "query": o.query_prompt.replace("\\n", "\n")}
        if o.task is Task.sts:
            st_model.default_prompt_name = "query"
    return st_model


# ------------------------------------------------------------------------------------------- suites, report
def eval_suite(o: EvalOptions) -> None:
    """``--suite NAME --data-dir DIR``: every task of the suite (files checked before the model loads), the
    per-task table and the paper's averages."""
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
