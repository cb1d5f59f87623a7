"""Training losses; each takes embeddings and returns a dict of named parts that the trainer sums and logs."""

from __future__ import annotations

from medadapt.losses.asym_infonce import AsymInfoNCELoss
from medadapt.losses.hyrec import HyReCLoss
from medadapt.losses.infonce import InfoNCELoss
from medadapt.losses.learnable_infonce import LearnableTemperatureInfoNCELoss
from medadapt.losses.load_balance import LoadBalanceLoss, switch_load_balance
from medadapt.losses.mrl import MatryoshkaLoss
from medadapt.losses.union_ce import UnionCELoss

__all__ = ["AsymInfoNCELoss", "HyReCLoss", "InfoNCELoss", "LearnableTemperatureInfoNCELoss", "LoadBalanceLoss",
           "MatryoshkaLoss", "UnionCELoss", "switch_load_balance"]
