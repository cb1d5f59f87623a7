"""``medadapt eval``: retrieval, rerank, STS, and BMRetriever's QA / entity-linking / paper-recommendation
tasks from the command line (file formats: docs/evaluation.md): its options; what runs is
:mod:`medadapt.cli._eval_run` (imported when it runs, so ``--help`` imports no torch), every task through
:func:`medadapt.eval.tasks.evaluate`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from medadapt.cli._common import (
    BackendOption,
    CacheDirOpt,
    DeviceOpt,
    Instructions,
    Mode,
    QuietOpt,
    RerankDepthOpt,
    RerankDomainWeightsOpt,
    RerankOpt,
    RerankWeightOpt,
    Task,
    VerboseOpt,
    body,
    choices,
)

StsSimilarity = choices("StsSimilarity", "cosine", "dot", "model")
Route = choices("Route", "query", "document")


def _opt(type_, help: str, **kwargs):
    return Annotated[type_, typer.Option(help=help, **kwargs)]


ModelOpt = _opt(Optional[str], "Model alias, saved model folder, or hub id (default: minilm; with --index, the "
                               "index's own).")
DataOpt = _opt(str, "BEIR folder, task JSONL, or builtin dataset (medmini).")
SplitOpt = _opt(str, "qrels split (retrieval) or file split.")
MetricsOpt = _opt(Optional[str], "Comma-separated metrics, e.g. ndcg@10,recall@100,f1@10.")
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Encode without reading or writing the cache.")]
ModeOpt = _opt(Optional[Mode], "Retrieval side: dense, lexical or hybrid. A model with a learned-lexical branch "
                               "(HyReC, composed) offers all three (default hybrid), an index its own kind (a hybrid "
                               "index all three), a dense model dense (default) or hybrid (dense + BM25 over the "
                               "corpus, min-max fusion).")
PromptOpt = _opt(Optional[str], "Instruction prepended to queries (sets the model's 'query' prompt), e.g. 'Given a "
                                "question, retrieve ...\\nQuery: '.")
SimilarityOpt = _opt(StsSimilarity, "STS: cosine (as the papers score STS), dot, or the model's own.")
RouteOpt = _opt(Optional[Route], "STS on an asymmetric (CARE) model: the tower that encodes both sentences "
                                 "(default query).")
SuiteOpt = _opt(Optional[str], "Run a benchmark suite: cmedteb, cure, bmretriever, medmoe or cmteb "
                               "(reads --data-dir; layouts in docs/evaluation.md).")
DataDirOpt = _opt(Optional[Path], "The suite's data folder (one sub-folder or file per task).")
SuiteTasksOpt = _opt(Optional[str], "Comma-separated subset of the suite's tasks (default: all).")
InstructionsOpt = _opt(Optional[Instructions], "Suites: the papers' task instructions as query prompts: auto "
                                               "(default; only for a model whose saved query prompt is an "
                                               "instruction prompt), on, or off (the model's own prompts).")
NoInstructionsOpt = Annotated[bool, typer.Option("--no-instructions", help="Suites: same as --instructions off.")]
MtebOutputOpt = _opt(Optional[Path], "Also evaluate with the mteb package itself (same embeddings, through the "
                                     "cache) and write its result files under this folder.")
MtebTaskOpt = _opt(Optional[str], "Run this registered MTEB task (e.g. NFCorpus) on local data: --data is a BEIR "
                                  "folder or a local copy of the task's dataset repository.")
CompareOpt = _opt(Optional[tuple[str, str]], "Paired comparison of two runs (TREC run / JSON run files or models) "
                                             "on --data/--split: per-query nDCG@10 (or the first --metrics), "
                                             "bootstrap CI, paired t-test. A model is scored in --mode, else in its "
                                             "own default mode (hybrid for a learned-lexical model).")
IndexOpt = _opt(Optional[Path], "Evaluate this index folder (written by `medadapt index`) on --data / --split, "
                                "searched with the model it records (or --model, checked against it).")


def eval_cmd(
    model: ModelOpt = None,
    data: DataOpt = "medmini",
    split: SplitOpt = "test",
    task: _opt(Task, "What to evaluate.") = Task.retrieval,
    metrics: MetricsOpt = None,
    output: _opt(Optional[Path], "Write the metrics as JSON here.") = None,
    plot: _opt(Optional[Path], "Write a bar plot (PNG) of the metrics here.") = None,
    batch_size: _opt(int, "Encoding batch size.", min=1) = 64,
    device: DeviceOpt = None,
    cache_dir: CacheDirOpt = None,
    no_cache: NoCacheOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    mode: ModeOpt = None,
    query_prompt: PromptOpt = None,
    similarity: SimilarityOpt = StsSimilarity.cosine,
    route: RouteOpt = None,
    suite: SuiteOpt = None,
    data_dir: DataDirOpt = None,
    suite_tasks: SuiteTasksOpt = None,
    instructions: InstructionsOpt = None,
    no_instructions: NoInstructionsOpt = False,
    mteb_output: MtebOutputOpt = None,
    mteb_task: MtebTaskOpt = None,
    compare: CompareOpt = None,
    backend: BackendOption = "torch",
    index: IndexOpt = None,
    rerank: RerankOpt = None,
    rerank_weight: RerankWeightOpt = None,
    rerank_depth: RerankDepthOpt = None,
    rerank_domain_weights: RerankDomainWeightsOpt = None,
) -> None:
    """Evaluate a model or an index on retrieval (nDCG/Recall/MRR/MAP@k), rerank (MAP@10), STS
    (Pearson/Spearman), QA (Recall@5/20, nDCG@20), entity linking (Recall@1/5, MRR@5) or paper recommendation
    (MAP, nDCG)."""
    body("medadapt.cli._eval_run", "run_eval")(**locals())
