"""Training losses; each takes embeddings and returns a dict of named parts that the trainer sums and logs."""

from __future__ import annotations

from medadapt.losses.asym_infonce import AsymInfoNCELoss
from medadapt.losses.infonce import InfoNCELoss
from medadapt.losses.load_balance import LoadBalanceLoss, switch_load_balance
from medadapt.losses.mrl import MatryoshkaLoss

__all__ = ["AsymInfoNCELoss", "InfoNCELoss", "LoadBalanceLoss", "MatryoshkaLoss", "switch_load_balance"]
from medadapt.losses.hyrec import HyReCLoss  # noqa: E402
from medadapt.losses.learnable_infonce import LearnableTemperatureInfoNCELoss  # noqa: E402
from medadapt.losses.union_ce import UnionCELoss  # noqa: E402

__all__ += ["HyReCLoss", "LearnableTemperatureInfoNCELoss", "UnionCELoss"]
