"""Heads through the adapter API users already know. Importing this package (any medadapt head config does)
extends ``SentenceTransformer``'s PEFT-style adapter methods to medadapt heads::

    model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
    model.add_adapter(MoEConfig.paper(dim=384), adapter_name="med")   # a fresh MoE head, now active
    model.set_adapter("med"); model.disable_adapters(); model.enable_adapters(); model.active_adapters()

Modules: :mod:`.types` (head types), :mod:`.linear` (the ``linear`` and ``search_adaptor`` heads), :mod:`.stack`
(:class:`AdapterStack`), :mod:`.api` (the adapter calls, routes, :func:`attach` / :func:`find_head`), :mod:`.files`
(adapter-only folders) and :mod:`.compose` (composition as data, checked against a table).
"""

from __future__ import annotations

import medadapt.adapters.linear  # noqa: F401  (registers the "linear" and "search_adaptor" head types)
from medadapt.adapters.api import (adapter_names, add_adapter, attach, find_head, get_adapter, set_active,
                                   split_routes, stack_for)
from medadapt.adapters.files import (base_fingerprint, is_adapter_folder, load_adapter, load_adapter_model,
                                     read_adapter_config, save_adapter)
from medadapt.adapters.methods import install
from medadapt.adapters.stack import AdapterStack
from medadapt.adapters.types import AdapterType, adapter_type, adapter_types, register_adapter_type

__all__ = ["AdapterStack", "AdapterType", "adapter_names", "adapter_type", "adapter_types", "add_adapter",
           "attach", "base_fingerprint", "find_head", "get_adapter", "install", "is_adapter_folder",
           "load_adapter", "load_adapter_model", "read_adapter_config", "register_adapter_type", "save_adapter",
           "set_active", "split_routes", "stack_for"]

install()
