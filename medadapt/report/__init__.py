"""Run reports: ``medadapt report RUN_DIR`` turns a run folder written by ``medadapt train`` into one
self-contained HTML page (figures embedded as PNG ``data:`` URIs) with the training curves per stage and their
named loss parts, the expert load of MoE heads, the similarity of positives vs hard negatives, the metrics
beside the frozen baseline, and the queries that gained or lost most (per-query nDCG@10, pytrec_eval).

Neutral package: it reads the run's files, loads the model with :func:`medadapt.load`, encodes through
:class:`medadapt.cache.EmbeddingCache`, and sees MoE routing only through the saved log and the
:class:`~medadapt.report.analysis.RoutingStatsSource` protocol. See ``docs/report.md``.

Example:
    >>> from medadapt.report import build_report
    >>> build_report("runs/demo")          # writes runs/demo/report.html
"""

from __future__ import annotations

from medadapt.report.analysis import RoutingStatsSource, analyse_retrieval, per_query_ndcg
from medadapt.report.build import build_report
from medadapt.report.run_folder import RunFolder, read_run

__all__ = ["RoutingStatsSource", "RunFolder", "analyse_retrieval", "build_report", "per_query_ndcg",
           "read_run"]
