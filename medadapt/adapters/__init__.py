"""Heads through the adapter API users already know: ``SentenceTransformer(...).add_adapter(config)``.

Importing this package (any medadapt head config does) extends ``SentenceTransformer``'s PEFT-style adapter
methods to medadapt heads (:mod:`medadapt.adapters.methods`, :mod:`medadapt.adapters.api`)::

    from sentence_transformers import SentenceTransformer
    from medadapt.moe import MoEConfig

    model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
    model.add_adapter(MoEConfig.paper(dim=384), adapter_name="med")   # a fresh MoE head, now active
    model.set_adapter("med"); model.disable_adapters(); model.enable_adapters(); model.active_adapters()

* :mod:`medadapt.adapters.types`: the registry of head types (systems register theirs).
* :mod:`medadapt.adapters.stack`: :class:`AdapterStack`, the module that holds the named heads.
* :mod:`medadapt.adapters.files`: adapter-only folders (:func:`save_adapter`, :func:`load_adapter`,
  :func:`load_adapter_model`) tied to the base model by a weight fingerprint.
* :mod:`medadapt.adapters.compose`: composition as data (heads on routes, branches), checked against a
  table of allowed combinations.
* :mod:`medadapt.adapters.linear`: the built-in ``linear`` and ``search_adaptor`` head types
  (:mod:`medadapt.heads.linear`), registered when this package is imported.
"""

from __future__ import annotations

import medadapt.adapters.linear  # noqa: F401  (registers the "linear" and "search_adaptor" head types)
from medadapt.adapters.api import adapter_names, add_adapter, get_adapter, set_active, split_routes, stack_for
from medadapt.adapters.files import (base_fingerprint, is_adapter_folder, load_adapter, load_adapter_model,
                                     read_adapter_config, save_adapter)
from medadapt.adapters.methods import install
from medadapt.adapters.stack import AdapterStack
from medadapt.adapters.types import AdapterType, adapter_type, adapter_types, register_adapter_type

__all__ = ["AdapterStack", "AdapterType", "adapter_names", "adapter_type", "adapter_types", "add_adapter",
           "base_fingerprint", "get_adapter", "install", "is_adapter_folder", "load_adapter",
           "load_adapter_model", "read_adapter_config", "register_adapter_type", "save_adapter",
           "set_active", "split_routes", "stack_for"]

install()
