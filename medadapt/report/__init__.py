"""Run reports: ``medadapt report RUN_DIR`` turns a run folder into one self-contained HTML page: training
curves, MoE expert load, positives vs hard negatives, metrics beside the frozen baseline, and the queries that
gained or lost most. Neutral: MoE routing is seen only through the saved log and the
:class:`~medadapt.report.analysis.RoutingStatsSource` protocol. See ``docs/report.md``.
"""

from __future__ import annotations

from medadapt.report.analysis import RoutingStatsSource, analyse_retrieval, per_query_ndcg
from medadapt.report.build import build_report
from medadapt.report.run_folder import RunFolder, read_run

__all__ = ["RoutingStatsSource", "RunFolder", "analyse_retrieval", "build_report", "per_query_ndcg",
           "read_run"]
