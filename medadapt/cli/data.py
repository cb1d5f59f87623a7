"""``medadapt data``: training-data curation (mine, filter, dedup, label, sts-triplets): the options; what runs
is :mod:`medadapt.cli._data_run` (imported when a command runs, so ``--help`` imports no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from medadapt.cli._common import CacheDirOpt, DeviceOpt, QuietOpt, VerboseOpt, body, choices
from medadapt.cli._help import DATA_GROUP, App

RUN = "medadapt.cli._data_run"
data_app = App(**DATA_GROUP)
Retriever = choices("Retriever", "dense", "bm25")
Language = choices("Language", "auto", "en", "zh")
Kind = choices("Kind", "query", "document")
Policy = choices("Policy", "unanimous", "majority")
AgreementOn = choices("AgreementOn", "label", "grade")
LabelFormat = choices("LabelFormat", "pairs", "groups")
StsFormat = choices("StsFormat", "triplets", "pairs")
Mode = choices("Mode", "all", "any")

ModelOpt = Annotated[str, typer.Option(help="Model alias (minilm), saved model folder, or hub id (dense).")]
LanguageOpt = Annotated[Language, typer.Option(help="BM25 tokenisation (auto: by CJK share).")]
CacheOpt = CacheDirOpt
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="Output JSONL (written atomically).")]


# --------------------------------------------------------------------------------------------- mine
@data_app.command("mine")
def mine_cmd(
    output: OutputOpt,
    data: Annotated[str, typer.Option(help="BEIR folder or builtin dataset (medmini).")] = "medmini",
    split: Annotated[str, typer.Option(help="qrels split whose queries are mined.")] = "train",
    retriever: Annotated[Retriever, typer.Option(help="Candidate retriever.")] = Retriever.dense,
    model: ModelOpt = "minilm",
    language: LanguageOpt = Language.auto,
    preset: Annotated[Optional[str], typer.Option(
        help="Paper settings, contributed by the systems: hyrec (ranks 20-100, 3 negs), med-moe (6-10, 5), "
             "bmretriever (1-100, 1)."
    )] = None,
    window: Annotated[Optional[str], typer.Option(help="Rank window lo-hi (1-based).")] = None,
    num_negatives: Annotated[Optional[int], typer.Option(min=1, help="Negatives per query.")] = None,
    margin: Annotated[Optional[float], typer.Option(min=0.0, help="Drop candidates scoring above "
                                                                 "pos_score*(1-margin).")] = None,
    absolute_margin: Annotated[Optional[float], typer.Option(help="Drop candidates scoring above "
                                                                  "pos_score-margin.")] = None,
    text_dup_threshold: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Drop candidates with char-3-gram Jaccard >= this to a positive (0: off)."
    )] = 0.8,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 42,
    no_scores: Annotated[bool, typer.Option("--no-scores", help="Omit pos_scores / neg_scores.")] = False,
    keep_empty: Annotated[bool, typer.Option("--keep-empty", help="Keep queries without negatives.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Queries per search call.")] = 256,
    device: DeviceOpt = None,
    cache_dir: CacheOpt = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Mine hard negatives by rank window; write FlagEmbedding JSONL {query, pos, neg, *_scores}."""
    body(RUN, "run_mine")(**locals())


# --------------------------------------------------------------------------------------------- filter
@data_app.command("filter")
def filter_cmd(
    input: Annotated[Path, typer.Option("--input", "-i", help="FlagEmbedding JSONL of synthetic groups.")],
    output: OutputOpt,
    corpus: Annotated[Optional[str], typer.Option(
        help="BEIR folder or corpus.jsonl searched besides the positives (BMRetriever: the whole corpus)."
    )] = None,
    retriever: Annotated[Retriever, typer.Option(help="Retriever judging consistency.")] = Retriever.dense,
    model: ModelOpt = "minilm",
    language: LanguageOpt = Language.auto,
    top_k: Annotated[int, typer.Option(min=1, help="Keep a pair when its passage ranks in this top-k.")] = 3,
    mode: Annotated[Mode, typer.Option(help="Several positives: all / any must rank.")] = Mode.all,
    batch_size: Annotated[int, typer.Option(min=1, help="Queries per search call.")] = 256,
    device: DeviceOpt = None,
    cache_dir: CacheOpt = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Consistency filter (BMRetriever): keep synthetic pairs whose passage ranks in the retriever's top-k."""
    body(RUN, "run_filter")(**locals())


# --------------------------------------------------------------------------------------------- dedup
@data_app.command("dedup")
def dedup_cmd(
    input: Annotated[Path, typer.Option("--input", "-i", help="JSONL whose lines hold the texts "
                                                               "(queries.jsonl, corpus.jsonl ...).")],
    output: OutputOpt,
    kind: Annotated[Kind, typer.Option(help="query (encode_query, τ=0.85) or document (encode_document, "
                                            "title+text, τ=0.78).")] = Kind.query,
    field: Annotated[str, typer.Option(help="JSON field holding the text.")] = "text",
    model: ModelOpt = "minilm",
    k: Annotated[int, typer.Option(min=1, help="Neighbours retrieved per candidate.")] = 5,
    threshold: Annotated[Optional[float], typer.Option(help="Similarity τ (default by --kind).")] = None,
    max_neighbors: Annotated[int, typer.Option(min=0, help="Discard when > m neighbours exceed τ.")] = 1,
    seed_size: Annotated[int, typer.Option(min=0, help="Items inserted unconditionally first.")] = 5000,
    batch_size: Annotated[int, typer.Option(min=1, help="Candidates checked per batch.")] = 2048,
    index: Annotated[str, typer.Option(help="flat (exact) or hnsw (approximate, for millions).")] = "flat",
    discarded: Annotated[Optional[Path], typer.Option(help="Also write the discarded lines here.")] = None,
    report: Annotated[Optional[Path], typer.Option(help="Write the counts as JSON here.")] = None,
    device: DeviceOpt = None,
    cache_dir: CacheOpt = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Diversity-aware dedup (CARE App. B): stream into an index; drop items with > m neighbours above τ."""
    body(RUN, "run_dedup")(**locals())


# --------------------------------------------------------------------------------------------- label
@data_app.command("label")
def label_cmd(
    input: Annotated[Path, typer.Option("--input", "-i", help="{query, passages} or {query, pos, neg}.")],
    output: OutputOpt,
    judge: Annotated[list[str], typer.Option(help="Judge, repeat >= 2 times: openai:MODEL[@BASE_URL] or "
                                                  "package.module:object.")],
    rubric: Annotated[str, typer.Option(help="cmedteb (S/A/B/C/D) or cure (0-2).")] = "cmedteb",
    policy: Annotated[Policy, typer.Option(help="unanimous (CMedTEB) or majority.")] = Policy.unanimous,
    agreement_on: Annotated[AgreementOn, typer.Option(help="Agree on labels or grades.")] = AgreementOn.label,
    positive_grades: Annotated[Optional[str], typer.Option(help="Comma-separated grades counted positive "
                                                               "(default: S,A / 2,1).")] = None,
    fmt: Annotated[LabelFormat, typer.Option("--format", help="pairs (one labelled pair per line) or groups "
                                                                "(FlagEmbedding).")] = LabelFormat.pairs,
    api_key_env: Annotated[str, typer.Option(help="Environment variable holding the API key of openai: "
                                                  "judges.")] = "OPENAI_API_KEY",
    allow_insecure_http: Annotated[bool, typer.Option("--allow-insecure-http", help="Send the API key over plain "
                                                      "http:// to a host other than this machine.")] = False,
    report: Annotated[Optional[Path], typer.Option(help="Write counts and Fleiss' kappa (JSON).")] = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Multi-judge consensus labels (CMedTEB): keep pairs the judges agree on; report Fleiss' kappa."""
    body(RUN, "run_label")(**locals())


# --------------------------------------------------------------------------------------------- sts
@data_app.command("sts-triplets")
def sts_cmd(
    synonyms: Annotated[Path, typer.Option(help="Synonym dictionary: JSON {term: [synonyms]} or TSV "
                                                "term<TAB>synonym...")],
    sentences: Annotated[Path, typer.Option(help="Sentences mentioning the terms: .txt (one per line) or "
                                                 ".jsonl with a 'text' field.")],
    generator: Annotated[str, typer.Option(help="openai:MODEL[@BASE_URL] or package.module:object.")],
    output: OutputOpt,
    per_pair: Annotated[int, typer.Option(min=1, help="Sentences per (term, synonym) pair.")] = 1,
    symmetric: Annotated[bool, typer.Option(help="Let every synonym replace the others too.")] = True,
    fmt: Annotated[StsFormat, typer.Option("--format", help="triplets, or STS pairs {sentence1, sentence2, "
                                                              "score}.")] = StsFormat.triplets,
    seed: Annotated[int, typer.Option(help="Sentence sampling seed.")] = 42,
    api_key_env: Annotated[str, typer.Option(help="Environment variable with the API key (openai:).")] =
    "OPENAI_API_KEY",
    allow_insecure_http: Annotated[bool, typer.Option("--allow-insecure-http", help="Send the API key over plain "
                                                      "http:// to a host other than this machine.")] = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Synonym STS data (CMedTEB): positive / hard-negative / easy-negative sentences per synonym pair."""
    body(RUN, "run_sts")(**locals())


__all__ = ["data_app"]
