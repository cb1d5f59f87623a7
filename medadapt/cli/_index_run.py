"""What ``medadapt index`` and ``medadapt search`` run (their options: :mod:`medadapt.cli.index`): build a
retrieval index folder, swap its query encoder, query it, write TREC runs."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.table import Table

from medadapt.cache import EmbeddingCache
from medadapt.cli._common import check_backend_option, console, quiet_libraries, rerank_options, user_errors
from medadapt.data import builtin_names, check_split, data_folder, load_beir, load_queries, resolve_data_dir
from medadapt.data.jsonl import check_id, has_bad_id_chars, iter_lines, require_file
from medadapt.data.text import check_text
from medadapt.encode import launch_state, launched_processes, process_device, share_encoding
from medadapt.errors import DataError, MedAdaptError
from medadapt.io import atomic_open, check_output
from medadapt.models import check_device, load
from medadapt.retrieval.config import RetrieverConfig
from medadapt.retrieval.corpus import load_documents
from medadapt.retrieval.encoders import ST_TAG, offers_sparse, open_encoder
from medadapt.retrieval.late import MaxSimConfig, MaxSimReranker
from medadapt.retrieval.retriever import Retriever, with_fusion_defaults
from medadapt.retrieval.storage import INDEX_FOLDER, load_manifest
from medadapt.retrieval.upgrade import upgrade_qdrant_queries, upgrade_queries
from medadapt.retrieval.vectordb import open_qdrant
from medadapt.training.distributed import closes_process_group


@closes_process_group
def run_index(corpus: str, out: Path, model: str, kind, factory: str, ef_construction: int, ef_search: int,
              nprobe: int, fusion, dense_weight: float | None, language: str, batch_size: int, device: str | None,
              cache_dir: Path | None, quiet: bool, verbose: bool, backend: str) -> None:
    """``medadapt index``: build the index (``kind`` and ``fusion``: the command's choices)."""
    quiet_libraries()
    with user_errors():
        check_device(device)  # before reading the corpus or loading a model
        check_backend_option(backend, **{"a HyReC model": offers_sparse(model)})
        config = _index_config(kind, batch_size, factory, ef_construction, ef_search, nprobe, language, fusion,
                               dense_weight)
        check_output(out, INDEX_FOLDER, what="--out")  # a file, a non-index folder, unwritable: refused first
        t0 = time.perf_counter()
        docs = load_documents(corpus)  # validate the corpus before loading a model
        encoder, is_main = _index_encoder(model, config, docs, device, backend, cache_dir, batch_size, quiet)
        if not is_main:  # the main process builds the index from the filled cache
            return
        defaults = getattr(encoder, "fusion_defaults", None)
        if defaults:  # what the model was trained / tuned for, unless given on the command line
            config = with_fusion_defaults(config, defaults, method=fusion.value if fusion else None,
                                          dense_weight=dense_weight)
        retriever = Retriever.build(docs, encoder, config=config, model_name=model if encoder is not None else None,
                                    show_progress=not quiet)
        retriever.save(out)
        console.print(f"indexed {len(docs)} documents ({kind.value}"
                      f"{', ' + factory if config.uses_dense else ''}) in {time.perf_counter() - t0:.1f} s -> {out}")


def _index_config(kind, batch_size: int, factory: str, ef_construction: int, ef_search: int, nprobe: int,
                  language: str, fusion, dense_weight: float | None) -> RetrieverConfig:
    try:
        return RetrieverConfig(
            kind=kind.value, batch_size=batch_size,
            dense={"factory": factory, "ef_construction": ef_construction, "ef_search": ef_search, "nprobe": nprobe},
            lexical={"language": language},
            fusion={"method": fusion.value if fusion else "minmax",
                    "dense_weight": 1.0 if dense_weight is None else dense_weight},
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        raise MedAdaptError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def _index_encoder(model: str, config: RetrieverConfig, docs, device: str | None, backend: str,
                   cache_dir: Path | None, batch_size: int, quiet: bool):
    """``(encoder or None, is_main_process)``: the model's encoder when the index needs one (dense side, or a
    model with learned lexical vectors such as a HyReC folder); under ``accelerate launch`` every process
    encodes its share of the documents into the cache first."""
    if not offers_sparse(model) and not config.uses_dense:
        return None, True
    state = None
    if launched_processes() > 1:  # under `accelerate launch`: the processes share the corpus encode
        state = launch_state(device)
        device = process_device(state, device)
    source = model if backend == "torch" else load(model, device=device, backend=backend)
    encoder = open_encoder(source, device=device, cache=EmbeddingCache(cache_dir))
    if state is not None:
        _share_index_encode(encoder, docs, state, batch_size, quiet)
        return encoder, state.is_main_process
    return encoder, True


def run_upgrade_queries(model: str, index: Path | None, qdrant: str | None, collection: str | None,
                        device: str | None, quiet: bool, verbose: bool) -> None:
    """``medadapt index upgrade-queries``."""
    quiet_libraries()
    with user_errors():
        if (index is None) == (qdrant is None):
            raise MedAdaptError("give --index FOLDER or --qdrant PATH_OR_URL --collection NAME (one of them)")
        if (qdrant is None) != (collection is None):
            raise MedAdaptError("--collection goes with --qdrant, and --qdrant needs --collection")
        check_device(device)  # before loading the index's or the new model
        if index is not None:
            result = upgrade_queries(index, model, device=device, what="--index")
        else:
            client = open_qdrant(qdrant)
            try:
                result = upgrade_qdrant_queries(client, collection, model, device=device)
            finally:
                client.close()
        if not result.changed:
            console.print(f"{result.target} already encodes its queries with {_model_label(result.new)}; "
                          "nothing changed", soft_wrap=True)
            return
        console.print(f"upgraded the query encoder of {result.target}: {_model_label(result.old)} -> "
                      f"{_model_label(result.new)}; {result.n_docs} documents untouched (document encoder "
                      f"{result.document_fingerprint}, nothing re-encoded) in {result.seconds:.1f} s", soft_wrap=True)


def _model_label(info) -> str:
    return f"{info.name or '(unnamed model)'} (fingerprint {info.fingerprint})"


def _share_index_encode(encoder, docs, state, batch_size: int, quiet: bool) -> None:
    """Every process of the launch encodes its share of the documents into the encoder's embedding cache
    (:func:`medadapt.encode.share_encoding`), for a dense encoder that reads documents through one; a
    HyReC model (learned lexical side encoded in the index build) is refused rather than run N times."""
    model, cache = getattr(encoder, "model", None), getattr(encoder, "cache", None)
    if getattr(encoder, "encoder_tag", None) != ST_TAG or model is None or cache is None:
        raise MedAdaptError(f"under `accelerate launch` index shares the encode of a dense model through the "
                            f"embedding cache; {type(encoder).__name__} does not read one: build in one process")
    share_encoding(model, docs.indexed_texts(), cache=cache, batch_size=batch_size, show_progress=not quiet,
                   state=state)


def read_queries(path: Path) -> dict[str, str]:
    """Queries from a BEIR ``queries.jsonl`` or a TSV ``qid<TAB>text`` file."""
    if not path.is_file():
        raise DataError(f"queries file not found: {path}")
    if path.suffix == ".jsonl":
        return load_queries(path)
    queries: dict[str, str] = {}
    for lineno, line in iter_lines(path, "queries file"):
        if not line.strip():
            continue
        parts = line.rstrip("\r\n").split("\t", 1)
        if len(parts) != 2 or not parts[1].strip():
            raise DataError(f"{path}:{lineno}: expected 'qid<TAB>query text'")
        qid = check_id(parts[0].strip(), "query id", path, lineno)
        if qid in queries:
            raise DataError(f"{path}:{lineno}: duplicate query id {qid!r}")
        queries[qid] = parts[1].strip()
    if not queries:
        raise DataError(f"{path}: no queries")
    return queries


def run_search(index: Path, query: str | None, queries: str | None, split: str | None, k: int,
               output: Path | None, tag: str, model: str | None, device: str | None, quiet: bool, verbose: bool,
               backend: str, rerank=None, rerank_weight: float | None = None,
               rerank_depth: int | None = None, rerank_domain_weights: str | None = None) -> None:
    """``medadapt search``."""
    quiet_libraries()
    with user_errors():
        _check_search_options(query, queries, split, tag)
        check_device(device)
        check_backend_option(backend)
        check_output(output, what="--output")  # before loading the index and the model
        maxsim = rerank_options(rerank, rerank_weight, rerank_depth, rerank_domain_weights)
        config = MaxSimConfig.of(**maxsim) if maxsim is not None else None
        batch = load_search_queries(queries, split) if queries is not None else None
        retriever = _with_reranker(_open_index(index, model, device, backend), config, quiet)
        if batch is None:
            _print_hits(retriever.search(query, k), query)
            return
        t0 = time.perf_counter()
        lines = _trec_lines(retriever, batch, k, tag, index)
        if output is None:
            typer.echo("".join(lines), nl=False)
            return
        with atomic_open(output, "w") as f:
            f.writelines(lines)
        if not quiet:
            console.print(f"searched {len(batch)} queries in {time.perf_counter() - t0:.1f} s -> {output}")


def _check_search_options(query: str | None, queries: str | None, split: str | None, tag: str) -> None:
    if (query is None) == (queries is None):
        raise MedAdaptError("give either one QUERY or --queries FILE")
    if query is not None and not query.strip():
        raise MedAdaptError("the query is empty")
    if query is not None:
        check_text(query, "the query")
    if split is not None:
        if queries is None:
            raise MedAdaptError("--split applies to --queries")
        check_split(split)
    if has_bad_id_chars(tag):
        raise MedAdaptError(f"--tag {tag!r} contains whitespace or control characters (it is one TREC column)")


def load_search_queries(source: str, split: str | None = None) -> dict[str, str]:
    """``--queries``: a queries file (:func:`read_queries`), or a data set's queries (a BEIR folder or a
    builtin name; with ``split``, those judged in that qrels split, in qrels order)."""
    path = Path(source).expanduser()
    if path.is_file():
        if split is not None:
            raise MedAdaptError(f"--split applies to a data set (a BEIR folder or builtin dataset), not to the "
                                f"queries file {source}")
        return read_queries(path)
    if split is not None:
        return load_beir(source, [split]).split_queries(split)
    if not resolve_data_dir(source).is_dir():
        raise DataError(f"queries not found: {source} is neither a file, a folder nor a builtin dataset "
                        f"({', '.join(builtin_names())})")
    return load_queries(require_file(data_folder(source) / "queries.jsonl", "queries file"))


def _with_reranker(retriever: Retriever, config: MaxSimConfig | None, quiet: bool) -> Retriever:
    """``retriever`` re-ranked with MaxSim over its own model (``--rerank maxsim``), token vectors in the
    default embedding cache."""
    if config is None:
        return retriever
    if retriever.model is None or not callable(getattr(retriever.model, "encode_query", None)):
        raise MedAdaptError("--rerank maxsim needs the index's sentence-transformers model, and this index has none "
                            "(BM25 only): build it with a model (kind dense or hybrid)")
    return retriever.with_reranker(MaxSimReranker(retriever.model, config, show_progress=not quiet))


def _open_index(index: Path, model: str | None, device: str | None, backend: str) -> Retriever:
    """The index with its recorded model (or ``model``, checked against it), on ``backend``."""
    if backend != "torch":  # the index's model (or --model) on that runtime; its fingerprint must match
        recorded = load_manifest(index, verify=False)[0].model
        model = load(model or (recorded.name if recorded is not None else ""), device=device, backend=backend)
    return Retriever.load(index, model=model, device=device)


def _trec_lines(retriever: Retriever, batch: dict[str, str], k: int, tag: str, index: Path) -> list[str]:
    qids = list(batch)
    results = retriever.batch_search([batch[q] for q in qids], k)
    bad = next((hit.id for res in results for hit in res if has_bad_id_chars(hit.id)), None)
    if bad is not None:  # an index built from ids medadapt's loaders refuse (Python API, older versions)
        raise MedAdaptError(f"document id {bad!r} in {index} contains whitespace or control characters and "
                            "would split the TREC run line; rebuild the index with ids without them")
    return [f"{qid} Q0 {hit.id} {hit.rank} {hit.score:.6f} {tag}\n" for qid, res in zip(qids, results) for hit in res]


def _print_hits(result, query: str) -> None:
    table = Table(title=f"top {len(result)} for: {query}")
    for col in ("rank", "id", "score", "title", "text"):
        table.add_column(col, overflow="fold" if col == "text" else "ellipsis")
    for hit in result:
        snippet = hit.text if len(hit.text) <= 160 else hit.text[:157] + "..."
        table.add_row(str(hit.rank), hit.id, f"{hit.score:.4f}", hit.title, snippet)
    console.print(table)
