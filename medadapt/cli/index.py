"""``medadapt index`` and ``medadapt search``: their options; what they run is :mod:`medadapt.cli._index_run`
(imported when they run, so their ``--help`` imports no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from medadapt.cli._common import (
    BackendOption,
    CacheDirOpt,
    DeviceOpt,
    QuietOpt,
    RerankDepthOpt,
    RerankDomainWeightsOpt,
    RerankOpt,
    RerankWeightOpt,
    VerboseOpt,
    body,
    choices,
)
from medadapt.cli._help import App

RUN = "medadapt.cli._index_run"
Kind = choices("Kind", "dense", "lexical", "hybrid")
Fusion = choices("Fusion", "minmax", "zscore", "rrf", "sum")
index_app = App(no_args_is_help=False)


@index_app.callback(invoke_without_command=True)
def index_cmd(
    ctx: typer.Context,
    corpus: Annotated[Optional[str], typer.Option(help="BEIR folder, corpus.jsonl, or builtin dataset (medmini). "
                                                       "Required to build.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Index folder to write (replaced atomically if it is an "
                                                     "index). Required to build.")] = None,
    model: Annotated[str, typer.Option(help="Model alias (minilm), saved model folder, or hub id; a HyReC "
                                       "folder gives learned lexical vectors too.")] = "minilm",
    kind: Annotated[Kind, typer.Option(help="dense (FAISS), lexical (BM25) or hybrid (both, fused).")] = Kind.dense,
    factory: Annotated[str, typer.Option(help="FAISS index_factory string: Flat, HNSW32, IVF4096,PQ64 ...")] = "Flat",
    ef_construction: Annotated[int, typer.Option(min=1, help="HNSW build breadth.")] = 40,
    ef_search: Annotated[int, typer.Option(min=1, help="HNSW search breadth.")] = 64,
    nprobe: Annotated[int, typer.Option(min=1, help="IVF lists probed per query.")] = 16,
    fusion: Annotated[Optional[Fusion], typer.Option(
        help="Hybrid fusion method (sum: raw weighted sum, HyReC's NM sum). Default: the model's own (a HyReC "
             "folder: sum), else minmax.")] = None,
    dense_weight: Annotated[Optional[float], typer.Option(
        min=0.0, help="Hybrid weight of the dense side: score = lexical + dense_weight * dense (1: equal "
                      "weights). Default: the model's own (a HyReC folder: its trained or tuned weight), else "
                      "1.")] = None,
    language: Annotated[str, typer.Option(help="BM25 tokenisation: auto, en, zh, none.")] = "auto",
    batch_size: Annotated[int, typer.Option(min=1, help="Encoding batch size.")] = 64,
    device: DeviceOpt = None,
    cache_dir: CacheDirOpt = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    backend: BackendOption = "torch",
) -> None:
    """Build a dense, lexical or hybrid index over a corpus and save it as a checked folder (`medadapt index
    upgrade-queries`: give a built index a new query encoder)."""
    if _build_requested(ctx, corpus, out):
        body(RUN, "run_index")(**{k: v for k, v in locals().items() if k != "ctx"})


def _build_requested(ctx: typer.Context, corpus: str | None, out: Path | None) -> bool:
    """``index upgrade-queries ...`` takes no build option (its options follow its name); a build needs
    ``--corpus`` and ``--out`` (the group takes none, so Typer cannot require them)."""
    if ctx.invoked_subcommand is not None:
        given = [p.opts[0] for p in ctx.command.params
                 if getattr(ctx.get_parameter_source(p.name), "name", None) == "COMMANDLINE"]
        if given:
            ctx.fail(f"{', '.join(given)} build an index; give the options of `index {ctx.invoked_subcommand}` "
                     "after its name")
        return False
    for option, value in (("--corpus", corpus), ("--out", out)):
        if value is None:
            ctx.fail(f"Missing option '{option}'.")
    return True


@index_app.command("upgrade-queries")
def upgrade_queries_cmd(
    model: Annotated[str, typer.Option(help="The new model: a run or model folder, an adapter folder, an alias or a "
                                       "hub id, trained against the index's document encoder (a query-route "
                                       "head, a CARE query tower).")],
    index: Annotated[Optional[Path], typer.Option(help="Index folder written by `medadapt index` (swapped in as "
                                                       "a whole; its document files keep their bytes).")] = None,
    qdrant: Annotated[Optional[str], typer.Option(help="Instead of --index: a Qdrant database, an embedded "
                                                       "database folder or a server URL (http://...), with "
                                                       "--collection.")] = None,
    collection: Annotated[Optional[str], typer.Option(help="The Qdrant collection (with --qdrant).")] = None,
    device: DeviceOpt = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Swap the query encoder of a built index for a model with the same document encoder (a query-route head,
    a CARE query tower); no document is re-encoded, a model with another document encoder is refused."""
    body(RUN, "run_upgrade_queries")(**locals())


QueriesOpt = Annotated[Optional[str], typer.Option(
    help="Batch search: a queries.jsonl or qid<TAB>text file, or a BEIR folder or builtin dataset (medmini) whose "
         "queries are searched (with --split: the queries judged in that split).")]
SplitOpt = Annotated[Optional[str], typer.Option(
    help="With --queries naming a data set: search only the queries of this qrels split (a plain name such as "
         "test or dev; default: every query).")]


def search_cmd(
    index: Annotated[Path, typer.Option(help="Index folder written by `medadapt index`.")],
    query: Annotated[Optional[str], typer.Argument(help="One query (or use --queries).")] = None,
    queries: QueriesOpt = None,
    split: SplitOpt = None,
    k: Annotated[int, typer.Option("--k", "-k", min=1, help="Documents per query.")] = 10,
    output: Annotated[Optional[Path], typer.Option(help="TREC run file for --queries (default: stdout).")] = None,
    tag: Annotated[str, typer.Option(help="Run tag (last TREC column).")] = "medadapt",
    model: Annotated[Optional[str], typer.Option(help="Model to use (default: the one recorded in the index; "
                                                      "refused if it differs).")] = None,
    device: DeviceOpt = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    backend: BackendOption = "torch",
    rerank: RerankOpt = None,
    rerank_weight: RerankWeightOpt = None,
    rerank_depth: RerankDepthOpt = None,
    rerank_domain_weights: RerankDomainWeightsOpt = None,
) -> None:
    """Search an index: one query as a table, or --queries as a TREC run (qid Q0 docid rank score tag)."""
    body(RUN, "run_search")(**locals())
