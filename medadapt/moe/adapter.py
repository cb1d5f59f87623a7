"""Med-MoE-Embed as an adapter type (``"moe"``): ``model.add_adapter(MoEConfig(...))`` or the recipe's
``MoEHeadSection`` (whose ``dim`` comes from the backbone)."""

from __future__ import annotations

from typing import Any

from medadapt.adapters.types import AdapterType
from medadapt.errors import ConfigError
from medadapt.moe.config import MoEConfig
from medadapt.moe.head import MoEHead
from medadapt.moe.sections import MoEHeadSection

__all__ = ["MOE_ADAPTER"]


def _build(config: MoEConfig | MoEHeadSection, dim: int) -> MoEHead:
    if isinstance(config, MoEHeadSection):
        config = config.to_config(dim)
    if config.dim != dim:
        raise ConfigError(f"the head config has dim={config.dim} but the backbone's embedding is {dim}-d; "
                          f"use MoEConfig(dim={dim}, ...)")
    return MoEHead(config)


def _from_dict(data: dict[str, Any], dim: int) -> MoEHead:
    return _build(MoEConfig.from_dict(data), dim)


def _describe(head: MoEHead) -> str:
    c = head.config
    n = sum(p.numel() for p in head.parameters())
    routed = f" + {len(c.routed_experts)} routed ({', '.join(c.routed_experts)}), top-{c.top_k}" \
        if c.routed_experts else ""
    return (f"Med-MoE-Embed head: {len(c.shared_experts)} shared ({', '.join(c.shared_experts)}){routed}, "
            f"expansion {c.expansion}, {_scales(head)}; {n:,} parameters")


def _scales(head: MoEHead) -> str:
    c = head.config
    if not c.domains:
        return f"residual scale {head.residual_scale}"
    return "residual scale by domain " + ", ".join(f"{d} {g:g}" for d, g in zip(c.domains, c.domain_scales))


MOE_ADAPTER = AdapterType(
    name="moe", config_classes=(MoEConfig, MoEHeadSection), build=_build,
    config_of=lambda head: head.get_config_dict(), from_dict=_from_dict, describe=_describe)
